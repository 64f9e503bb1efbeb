import { $, element } from "./dom.js";

// What each model was trained on (its /v1/models `trained_on`), said before the user types, and
// example texts from that domain: a model shown only text it never saw looks broken, not narrow.

// Image captions in the style of Multi30k (descriptions of Flickr photos), written for this page:
// the default translators' domain, offered in the selected model's source language.
const CAPTIONS = {
  en: [
    "Two dogs are playing in the snow.",
    "A man in a blue shirt is riding a bicycle down the street.",
    "A little girl is climbing the stairs to a wooden playhouse.",
    "A group of people are standing in front of a building.",
  ],
  de: [
    "Zwei Hunde spielen im Schnee.",
    "Ein Mann in einem blauen Hemd fährt mit dem Fahrrad die Straße entlang.",
    "Ein kleines Mädchen klettert die Treppe zu einem Spielhaus aus Holz hinauf.",
    "Eine Gruppe von Menschen steht vor einem Gebäude.",
  ],
};
const CAPTION_DATA = /multi30k|flickr|image caption/i;

// English sentence pairs, close and far in meaning: a general-purpose embedder's domain.
const SENTENCE_PAIRS = [
  ["A man is playing a guitar.", "Someone is playing an instrument."],
  ["A woman is slicing an onion.", "A woman is cutting vegetables."],
  ["The cat sits on the mat.", "The stock market fell sharply today."],
];

// The translator's examples: captions in its source language when its data is image captions.
function translationExamples(model) {
  const language = (model.source_languages || [])[0];
  return CAPTION_DATA.test(model.trained_on || "") ? CAPTIONS[language] || [] : [];
}

function embeddingExamples() {
  return SENTENCE_PAIRS.map((pair) => pair.join("\n"));
}

// "<model> was trained on …" and the plain warning, then a button per example that puts it into
// the form's text (`use(text)`).
function describeDomain(model, examples, use) {
  const name = element("strong", { text: model.id });
  const said = model.trained_on
    ? [name, " was trained on ", element("q", { text: model.trained_on }), "."]
    : [name, "'s manifest does not say what it was trained on."];
  const about = [
    element("p", { class: "trained-on" }, ...said),
    element("p", {
      class: "domain-warning",
      text:
        model.task === "translate"
          ? "Text far from that domain translates poorly: expect nonsense for news, dialogue or " +
            "technical text."
          : "Similarities of text far from that domain are less reliable.",
    }),
  ];
  if (!examples.length) return about;
  const buttons = examples.map((text) => {
    const label = text.replace("\n", " / "); // a pair's two lines
    const button = element("button", { type: "button", class: "example", text: label });
    button.addEventListener("click", () => use(text));
    return element("li", {}, button);
  });
  const heading = model.task === "translate" ? "Examples from its domain" : "Example sentence pairs";
  return [
    ...about,
    element("p", { class: "examples-title", text: `${heading}:` }),
    element("ul", { class: "examples" }, ...buttons),
  ];
}

// Each panel says what its model was trained on and offers examples from that domain; the
// translate panel's model is the one selected (the first translator, the service's default, at first).
let translators = [];

// A model of one pair is asked by name alone; one of several (NLLB, M2M-100) also for its pair,
// from its languages as /v1/models lists them.
const NAMES = new Intl.DisplayNames(["en"], { type: "language" });

function languageName(code) {
  try {
    return `${NAMES.of(code)} (${code})`;
  } catch {
    return code; // not a BCP 47 tag the browser knows
  }
}

function manyPairs(model) {
  return (model.source_languages || []).length * (model.target_languages || []).length > 4;
}

// "en→de", or "3 languages" for a model of many pairs.
export function pairLabel(model) {
  const sources = model.source_languages || [];
  const targets = model.target_languages || [];
  if (manyPairs(model)) return `${new Set([...sources, ...targets]).size} languages`;
  return `${sources.join("/")}→${targets.join("/")}`;
}

function fillLanguages(id, codes) {
  const kept = $(id).value;
  $(id).replaceChildren(...codes.map((code) => element("option", { value: code, text: languageName(code) })));
  if (codes.includes(kept)) $(id).value = kept;
}

function showLanguages(model) {
  const several = Boolean(model) && manyPairs(model);
  $("translate-languages").hidden = !several;
  fillLanguages("translate-source", several ? model.source_languages : []);
  fillLanguages("translate-target", several ? model.target_languages : []);
}

// The pair chosen for a model of many pairs; none for the others (the model's own).
export function chosenLanguages() {
  if ($("translate-languages").hidden) return {};
  return { source_language: $("translate-source").value, target_language: $("translate-target").value };
}

// The language pair translated: the chosen one of a model of many pairs, else the model's own.
export function translationPair() {
  const model = translators.find((m) => m.id === $("translate-model").value);
  if (!model) return null;
  const chosen = chosenLanguages();
  const source = chosen.source_language ?? model.source_languages?.[0];
  const target = chosen.target_language ?? model.target_languages?.[0];
  return source && target ? { source, target } : null;
}

function showTranslatorDomain() {
  const model = translators.find((m) => m.id === $("translate-model").value);
  showLanguages(model);
  const use = (text) => {
    $("translate-text").value = text;
    $("translate-text").focus();
  };
  const about = model ? describeDomain(model, translationExamples(model), use) : [];
  $("translate-domain").replaceChildren(...about);
}

// The /v1/models cards: the translators into the model choice, each panel's domain shown.
export function showModels(cards) {
  const selected = $("translate-model").value;
  translators = cards.filter((m) => m.task === "translate");
  $("translate-model").replaceChildren(
    ...translators.map((m) => {
      return element("option", { value: m.id, text: `${m.id} (${pairLabel(m)})` });
    }),
  );
  if (translators.some((m) => m.id === selected)) $("translate-model").value = selected;
  showTranslatorDomain();
  const embedder = cards.find((m) => m.task === "embed");
  const use = (text) => {
    $("embed-text").value = text;
    $("embed-text").focus();
  };
  const about = embedder ? describeDomain(embedder, embeddingExamples(), use) : [];
  $("embed-domain").replaceChildren(...about);
}

export function watchModelChoice() {
  $("translate-model").addEventListener("change", showTranslatorDomain);
}

// The playground: plain DOM, public API only (/v1/models, /v1/translate, /v1/glossaries, /v1/embed). A module: strict.

import { $, element } from "./dom.js";
import { ApiError, KEY_STORAGE, NetworkError, call, whenUnauthorized } from "./api.js";
import { chosenLanguages, pairLabel, showModels, watchModelChoice } from "./domain.js";
import {
  legend,
  markedText,
  refreshGlossaries,
  requiredOfSentences,
  terminology,
  watchTerminology,
} from "./glossary.js";
import { InputError } from "./terms.js";

// ---- small DOM helpers ---------------------------------------------------------------------

function showError(target, error) {
  const box = $(target);
  box.replaceChildren();
  if (error instanceof ApiError) {
    box.append(element("strong", { text: `${error.status} ${error.type}` }), `: ${error.message}`);
    if (error.details.length) {
      box.append(
        element("ul", {}, ...error.details.map((d) => element("li", { text: `${d.field}: ${d.message}` }))),
      );
    }
    const notes = [];
    if (error.retryAfter) notes.push(`retry after ${error.retryAfter} s`);
    if (error.requestId) notes.push(`request id ${error.requestId}`);
    if (notes.length) box.append(element("div", { class: "note", text: notes.join(" · ") }));
  } else if (error instanceof InputError) {
    box.textContent = error.message;
  } else if (error instanceof NetworkError) {
    box.textContent = `The ${error.message}.`;
  } else {
    box.textContent = `The page failed: ${error.message}`;
  }
  box.hidden = false;
}

function clearError(target) {
  $(target).hidden = true;
  $(target).replaceChildren();
}

function showTimings(target, timings, roundTrip) {
  const list = element("ul", { class: "timing-list", "aria-label": "Stage timings of this request" });
  for (const t of timings) {
    list.append(
      element(
        "li",
        { "data-stage": t.name, title: t.desc },
        element("span", { text: t.name }),
        t.dur === null ? "" : ` ${t.dur.toFixed(1)} ms`,
      ),
    );
  }
  list.append(
    element(
      "li",
      { "data-stage": "browser", title: "fetch to parsed JSON, measured here" },
      element("span", { text: "round trip" }),
      ` ${roundTrip.toFixed(1)} ms`,
    ),
  );
  $(target).replaceChildren(element("h3", { text: "Timings" }), list);
}

// One form submission at a time; the button stays focusable (disabling it would drop keyboard focus).
function bindForm(formId, buttonId, action) {
  const form = $(formId);
  const button = $(buttonId);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (button.getAttribute("aria-busy") === "true") return;
    button.setAttribute("aria-busy", "true");
    try {
      await action();
    } finally {
      button.removeAttribute("aria-busy");
    }
  });
  for (const area of form.querySelectorAll("textarea")) {
    area.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
  }
}

// ---- models and key ------------------------------------------------------------------------

function describeModel(m) {
  const parts = [m.task, m.variant, m.provider.replace("ExecutionProvider", "")];
  if (m.task === "translate" && m.source_languages && m.target_languages) {
    parts.push(pairLabel(m));
  }
  if (m.dim) parts.push(`dim ${m.dim}`);
  return element(
    "span",
    { class: "model", "data-model": m.id },
    element("strong", { text: m.id }),
    ` (${parts.join(", ")})`,
  );
}

async function loadModels() {
  const line = $("models");
  try {
    const { payload } = await call("/v1/models");
    const models = payload.data.map(describeModel);
    line.replaceChildren(...models.flatMap((m, i) => (i ? [" · ", m] : [m])));
    if (!models.length) line.textContent = "No models are served.";
    showModels(payload.data);
    if (sessionStorage.getItem(KEY_STORAGE)) $("key-section").hidden = true;
  } catch (error) {
    line.textContent =
      error instanceof ApiError
        ? `Models unavailable: ${error.status} ${error.type}: ${error.message}`
        : `Models unavailable: ${error.message}`;
  }
}

function askForKey(error) {
  const message = $("key-message");
  message.textContent =
    error.status === 403
      ? `${error.status} ${error.type}: ${error.message} — enter a valid key.`
      : `${error.status} ${error.type}: ${error.message}`;
  message.hidden = false;
  const section = $("key-section");
  if (section.hidden) {
    section.hidden = false;
    $("api-key").focus();
  }
}

// ---- translation ---------------------------------------------------------------------------

function heatmap(sentence, index) {
  const best = sentence.hypotheses[0];
  const targets = best.tokens || [];
  const sources = sentence.source_tokens || [];
  const weights = best.alignment || [];
  const table = element("table", {
    class: "heatmap",
    "data-rows": String(targets.length),
    "data-cols": String(sources.length),
  });
  table.append(
    element("caption", {
      text: `Sentence ${index + 1}: ${targets.length} output × ${sources.length} source subwords`,
    }),
  );
  const head = element("tr", {}, element("th", { scope: "col", class: "corner" }));
  for (const token of sources)
    head.append(element("th", { scope: "col", class: "source-token" }, element("span", { text: token })));
  table.append(element("thead", {}, head));
  const body = element("tbody");
  targets.forEach((target, t) => {
    const row = element("tr", {}, element("th", { scope: "row", class: "target-token", text: target }));
    sources.forEach((source, s) => {
      const weight = (weights[t] && weights[t][s]) || 0;
      const cell = element("td", {
        "data-value": weight.toFixed(4),
        title: `${target} ← ${source}: ${weight.toFixed(3)}`,
        "aria-label": `${target} attends to ${source}: ${weight.toFixed(3)}`,
      });
      cell.style.setProperty("--weight", weight.toFixed(4));
      row.append(cell);
    });
    body.append(row);
  });
  table.append(body);
  // Scrolls inside itself (never the page) when a long sentence is wider than the screen.
  const box = element(
    "div",
    {
      class: "heatmap-scroll",
      tabindex: "0",
      role: "region",
      "aria-label": `Attention, sentence ${index + 1}: arrow keys move between cells`,
    },
    table,
  );
  const readout = element("p", {
    class: "readout",
    "aria-live": "polite",
    text: "Hover a cell, or focus the map and use the arrow keys.",
  });
  exploreCells(box, table, readout);
  return [box, readout];
}

// The weight under the pointer, or under a cursor the arrow keys move while the map has the focus.
function exploreCells(box, table, readout) {
  const rows = [...table.tBodies[0].rows].map((r) => [...r.querySelectorAll("td")]);
  let at = null; // [row, column] of the keyboard cursor
  const show = (cell) => {
    readout.textContent = cell.title;
  };
  table.addEventListener("mouseover", (event) => {
    if (event.target instanceof HTMLTableCellElement && event.target.dataset.value) show(event.target);
  });
  box.addEventListener("keydown", (event) => {
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    const move = moves[event.key];
    if (!move || !rows.length || !rows[0].length) return;
    event.preventDefault(); // the cursor moves, not the page
    if (at) rows[at[0]][at[1]].classList.remove("cursor");
    at = at
      ? [
          Math.min(Math.max(at[0] + move[0], 0), rows.length - 1),
          Math.min(Math.max(at[1] + move[1], 0), rows[0].length - 1),
        ]
      : [0, 0];
    const cell = rows[at[0]][at[1]];
    cell.classList.add("cursor");
    cell.scrollIntoView({ block: "nearest", inline: "nearest" });
    show(cell);
  });
}

// `required`: the glossary terms and kept spans marked in each hypothesis.
function nBest(hypotheses, required) {
  return element(
    "ol",
    { class: "nbest" },
    ...hypotheses.map((h) =>
      element(
        "li",
        {},
        element("span", { class: "hypothesis" }, ...markedText(h.text, required)),
        " ",
        element("span", {
          class: "score",
          title: "length-normalised log-probability",
          text: h.score.toFixed(3),
        }),
      ),
    ),
  );
}

// `terms`: the glossary's entries and the spans kept, marked where each sentence required them.
function renderTranslation(payload, terms) {
  const out = $("translation");
  out.replaceChildren();
  if (terms.entries.length || terms.kept.length) out.append(legend());
  const requiredOf = (sentences) => requiredOfSentences(sentences, terms.entries, terms.kept);
  for (const translation of payload.translations) {
    const sources = translation.sentences.map((s) => s.source);
    out.append(element("h3", { text: "Whole text" }), nBest(translation.hypotheses, requiredOf(sources)));
    translation.sentences.forEach((sentence, i) => {
      const pieces = sentence.pieces > 1 ? ` (translated in ${sentence.pieces} pieces)` : "";
      out.append(
        element(
          "article",
          { class: "sentence", "data-sentence": String(i) },
          element("h4", { text: `Sentence ${i + 1}${pieces}` }),
          element("p", { class: "source", text: sentence.source }),
          nBest(sentence.hypotheses, requiredOf([sentence.source])),
          ...heatmap(sentence, i),
        ),
      );
    });
  }
}

async function translate() {
  clearError("translate-error");
  try {
    const terms = await terminology();
    const { payload, timings, roundTrip } = await call("/v1/translate", {
      model: $("translate-model").value || undefined, // none listed yet: the service's default
      ...chosenLanguages(),
      text: $("translate-text").value,
      beam_size: Number($("beam-size").value),
      n_best: Number($("n-best").value),
      alignments: true,
      ...terms.fields,
    });
    renderTranslation(payload, terms);
    showTimings("translate-timings", timings, roundTrip);
  } catch (error) {
    showError("translate-error", error);
  }
}

// ---- embeddings ----------------------------------------------------------------------------

function similarityMatrix(sentences, vectors) {
  const n = vectors.length;
  const table = element("table", { class: "similarity", "data-n": String(n) });
  table.append(element("caption", { text: `Cosine similarity of ${n} sentences` }));
  const head = element("tr", {}, element("th", { scope: "col", class: "corner" }));
  sentences.forEach((s, j) => head.append(element("th", { scope: "col", title: s, text: String(j + 1) })));
  table.append(element("thead", {}, head));
  const body = element("tbody");
  vectors.forEach((a, i) => {
    const row = element("tr", {}, element("th", { scope: "row", title: sentences[i], text: String(i + 1) }));
    vectors.forEach((b, j) => {
      const cosine = a.reduce((sum, x, k) => sum + x * b[k], 0); // the vectors come normalised
      const cell = element("td", {
        "data-value": cosine.toFixed(4),
        title: `${i + 1} · ${j + 1}: ${cosine.toFixed(4)}`,
        text: cosine.toFixed(2),
      });
      cell.style.setProperty("--weight", Math.max(cosine, 0).toFixed(4));
      if (cosine > 0.55) cell.classList.add("dark"); // white figures on the darker cells
      row.append(cell);
    });
    body.append(row);
  });
  table.append(body);
  const legend = element("ol", { class: "legend" }, ...sentences.map((s) => element("li", { text: s })));
  return [
    legend,
    element(
      "div",
      { class: "heatmap-scroll", tabindex: "0", role: "region", "aria-label": "Similarity matrix" },
      table,
    ),
  ];
}

async function embed() {
  clearError("embed-error");
  const sentences = $("embed-text")
    .value.split("\n")
    .filter((line) => line.trim() !== "");
  try {
    const { payload, timings, roundTrip } = await call("/v1/embed", { texts: sentences, normalize: true });
    $("similarity").replaceChildren(...similarityMatrix(sentences, payload.embeddings));
    showTimings("embed-timings", timings, roundTrip);
  } catch (error) {
    showError("embed-error", error);
  }
}

// ---- start ---------------------------------------------------------------------------------

$("key-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const key = $("api-key").value.trim();
  if (!key) {
    $("key-message").textContent = "Enter a key.";
    $("key-message").hidden = false;
    return;
  }
  sessionStorage.setItem(KEY_STORAGE, key);
  $("key-message").hidden = true;
  await loadModels();
  if ($("key-section").hidden) $("translate-text").focus(); // the key section is gone: keep the keyboard's place
});
whenUnauthorized(askForKey);
watchModelChoice();
// The key's saved glossaries are listed once the terminology fields are opened, and again for
// another pair while they are open.
const listGlossaries = () => {
  if ($("terminology").open) refreshGlossaries().catch((error) => showError("translate-error", error));
};
$("terminology").addEventListener("toggle", listGlossaries);
for (const id of ["translate-model", "translate-source", "translate-target"]) {
  $(id).addEventListener("change", listGlossaries);
}
watchTerminology((error) => showError("translate-error", error));
bindForm("translate-form", "translate-button", translate);
bindForm("embed-form", "embed-button", embed);
loadModels();

// The translate panel's terminology: a glossary (typed entries, saved as a glossary of this key
// through /v1/glossaries, or one of the key's saved glossaries for the pair) and spans kept as
// written; and the translation's enforced terms and kept spans marked in the output.

import { ApiError, call } from "./api.js";
import { $, element } from "./dom.js";
import { translationPair } from "./domain.js";
import {
  entryLines,
  glossaryName,
  InputError,
  markedPieces,
  parseEntries,
  parseKept,
  requiredOf,
} from "./terms.js";

const TYPED = ""; // the choice of the entries typed in the box
const savedEntries = new Map(); // glossary id → its entries, read once
let typedText = ""; // the box's own text while it shows a saved glossary's entries
let madeHere = null; // the glossary this page last made from typed entries

function samePair(glossary, pair) {
  return glossary.source_language === pair.source && glossary.target_language === pair.target;
}

// The choice lists the key's glossaries for the pair chosen (none before a model is known).
export async function refreshGlossaries() {
  const pair = translationPair();
  const choice = $("glossary-choice");
  const kept = choice.value;
  const listed = pair
    ? (await call("/v1/glossaries")).payload.glossaries.filter((g) => samePair(g, pair))
    : [];
  choice.replaceChildren(
    element("option", { value: TYPED, text: "the entries typed below" }),
    ...listed.map((g) => element("option", { value: g.id, text: `${g.name} (${g.entry_count} entries)` })),
  );
  choice.value = listed.some((g) => g.id === kept) ? kept : TYPED;
  if (choice.value !== kept) await showChoice();
}

async function entriesOf(id) {
  if (!savedEntries.has(id)) {
    savedEntries.set(id, (await call(`/v1/glossaries/${encodeURIComponent(id)}`)).payload.entries);
  }
  return savedEntries.get(id);
}

// A saved glossary's entries fill the box, read-only; the typed ones come back when chosen again.
async function showChoice() {
  const box = $("glossary-entries");
  const id = $("glossary-choice").value;
  if (!box.readOnly) typedText = box.value;
  if (id === TYPED) {
    box.readOnly = false;
    box.value = typedText;
    return;
  }
  box.readOnly = true;
  box.value = (await entriesOf(id)).map((e) => `${e.source} = ${e.target}`).join("\n");
}

// The typed entries' glossary: found by its name (a hash of the entries and the pair) or made;
// the one this page made before for other entries is deleted, so edits do not pile up.
async function typedGlossary(entries, pair) {
  const name = glossaryName(entries, pair.source, pair.target);
  const listed = (await call("/v1/glossaries")).payload.glossaries;
  let id = listed.find((g) => g.name === name && samePair(g, pair))?.id;
  if (id === undefined) {
    const body = { name, source_language: pair.source, target_language: pair.target, entries };
    id = (await call("/v1/glossaries", body).catch(namingLines)).payload.id;
    if (madeHere && madeHere !== id) {
      await call(`/v1/glossaries/${encodeURIComponent(madeHere)}`, undefined, "DELETE").catch(() => {
        // already deleted elsewhere: nothing left to tidy
      });
      savedEntries.delete(madeHere);
    }
  }
  madeHere = id;
  savedEntries.set(id, entries);
  return id;
}

// A refusal of the typed entries says which line of the box each problem is on (the API names
// entries[i], which blank lines would make hard to find).
function namingLines(error) {
  if (!(error instanceof ApiError)) throw error;
  const lines = entryLines($("glossary-entries").value);
  const named = (text) =>
    text.replace(/entries\[(\d+)\](\.\w+)?/g, (found, i) =>
      lines[i] ? `${found} (line ${lines[i]})` : found,
    );
  error.message = named(error.message);
  error.details = error.details.map((d) => ({ ...d, field: named(d.field || "") }));
  throw error;
}

// What the translate request adds ({glossary, keep}, each only when given), and what the output
// marks: the glossary's entries and the spans kept.
export async function terminology() {
  const kept = parseKept($("keep-spans").value);
  const fields = kept.length ? { keep: kept } : {};
  const id = $("glossary-choice").value;
  if (id !== TYPED) return { fields: { ...fields, glossary: id }, entries: await entriesOf(id), kept };
  const entries = parseEntries($("glossary-entries").value);
  if (!entries.length) return { fields, entries, kept };
  const pair = translationPair();
  if (!pair) throw new InputError("No translation model is listed: a glossary needs its language pair.");
  const glossary = await typedGlossary(entries, pair);
  await refreshGlossaries();
  return { fields: { ...fields, glossary }, entries, kept };
}

// The terms and spans a text's translation was held to: those of each of its sentences.
export function requiredOfSentences(sources, entries, kept) {
  const each = sources.map((source) => requiredOf(source, entries, kept));
  return {
    entries: [...new Set(each.flatMap((r) => r.entries))],
    kept: [...new Set(each.flatMap((r) => r.kept))],
  };
}

// `text` with the required target terms and kept spans in <mark>s (text nodes: never parsed as HTML).
export function markedText(text, required) {
  return markedPieces(text, required.entries, required.kept).map((piece) =>
    piece.kind ? element("mark", { class: piece.kind, title: piece.title, text: piece.text }) : piece.text,
  );
}

export function legend() {
  return element(
    "p",
    { class: "terms-legend" },
    element("mark", { class: "term", text: "term" }),
    " a glossary's target term, required where its source term is in the sentence · ",
    element("mark", { class: "kept", text: "span" }),
    " a span kept as written",
  );
}

// `showError(error)`: a saved glossary's entries that cannot be read are said where others are.
export function watchTerminology(showError) {
  $("glossary-choice").addEventListener("change", () => showChoice().catch(showError));
}

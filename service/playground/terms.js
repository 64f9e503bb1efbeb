// The terminology fields read and the translation's enforced terms found: pure functions, no DOM.
//
// Source terms are matched as the service matches them (service/glossaries/matching.py and
// placeholders.py): per sentence, kept spans masked first (a term inside one is not matched),
// then every entry at once, case-sensitive and as whole words unless the entry says otherwise;
// of overlapping matches the longest wins, then the earlier. A page that matched otherwise would
// mark terms the service never required, or miss ones it did.

// A problem with what the user typed, said as is in the panel's error area.
export class InputError extends Error {}

// "source term = target term", or the two separated by a tab, one entry per non-blank line.
export function parseEntries(text) {
  const entries = [];
  text.split("\n").forEach((line, i) => {
    if (!line.trim()) return;
    const separator = line.includes("\t") ? "\t" : "=";
    const at = line.indexOf(separator);
    const source = line.slice(0, at).trim();
    const target = line.slice(at + 1).trim();
    if (at < 0 || !source || !target) {
      throw new InputError(
        `Glossary line ${i + 1}: write "source term = target term" (or the two terms separated by a tab).`,
      );
    }
    entries.push({ source, target });
  });
  return entries;
}

// The line (from 1) of each entry `parseEntries` reads from `text`: the API names entries by index.
export function entryLines(text) {
  return text.split("\n").flatMap((line, i) => (line.trim() ? [i + 1] : []));
}

// One span per line; on a single line, spans separated by commas. Each once, in order.
export function parseKept(text) {
  const parts = text.includes("\n") ? text.split("\n") : text.split(",");
  return [...new Set(parts.map((part) => part.trim()).filter(Boolean))];
}

// cyrb53 (a public-domain 53-bit string hash): crypto.subtle exists only on https and localhost.
function hash53(text) {
  let h1 = 0xdeadbeef;
  let h2 = 0x41c6ce57;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    h1 = Math.imul(h1 ^ c, 2654435761);
    h2 = Math.imul(h2 ^ c, 1597334677);
  }
  h1 = Math.imul(h1 ^ (h1 >>> 16), 2246822507) ^ Math.imul(h2 ^ (h2 >>> 13), 3266489909);
  h2 = Math.imul(h2 ^ (h2 >>> 16), 2246822507) ^ Math.imul(h1 ^ (h1 >>> 13), 3266489909);
  return 4294967296 * (2097151 & h2) + (h1 >>> 0);
}

// The name of the glossary made from typed entries: the same entries for the same pair give the
// same name, so translating again reuses the glossary instead of creating another.
export function glossaryName(entries, source, target) {
  const content = JSON.stringify([source, target, entries.map((e) => [e.source, e.target])]);
  return `playground-${hash53(content).toString(16).padStart(14, "0")}`;
}

// ---- matching, as the service does it ------------------------------------------------------

const MARKERS = "@%#"; // the placeholders' markers, in the service's order

const escaped = (text) => text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
const codePoints = (text) => Array.from(text); // the service counts and walks code points

// The kept spans found in `sentence`, longest first (the order the service masks them in).
export function keptIn(sentence, kept) {
  const found = [...new Set(kept)].filter((span) => span && sentence.includes(span));
  return found.sort((a, b) => codePoints(b).length - codePoints(a).length);
}

// `sentence` with each kept span replaced by its placeholder (@1@, @2@…), as the model reads it.
function masked(sentence, spans) {
  const marker = [...MARKERS].find((m) => !sentence.includes(m));
  if (!spans.length || marker === undefined) return sentence;
  const numbers = new Map(spans.map((span, i) => [span, `${marker}${i + 1}${marker}`]));
  return sentence.replace(new RegExp(spans.map(escaped).join("|"), "g"), (span) => numbers.get(span));
}

const WORD = /^[\p{L}\p{N}_]$/u; // Python's isalnum() or "_"
const isWord = (c) => c !== undefined && WORD.test(c);

function folded(c) {
  const lower = c.toLowerCase();
  return codePoints(lower).length === 1 ? lower : c; // one character for one, as the service folds
}

function fits(entry, chars, start, end) {
  if (entry.whole_word === false) return true;
  const leftIsWord = start > 0 && isWord(chars[start - 1]);
  const rightIsWord = end < chars.length && isWord(chars[end]);
  return !(leftIsWord && isWord(chars[start])) && !(rightIsWord && isWord(chars[end - 1]));
}

// The longest of `terms` (entries with their folded characters) that matches at `start`.
function longestAt(terms, chars, start, fold) {
  let found = null;
  for (const term of terms) {
    const length = term.chars.length;
    if (start + length > chars.length || (found && length <= found.end - start)) continue;
    if (
      term.chars.every((c, i) => fold(chars[start + i]) === c) &&
      fits(term.entry, chars, start, start + length)
    ) {
      found = { start, end: start + length, entry: term.entry };
    }
  }
  return found;
}

// The entries whose source term the service matches in `sentence`, in order of appearance.
export function matchedEntries(sentence, entries) {
  const chars = codePoints(sentence);
  const found = [];
  for (const [caseSensitive, fold] of [
    [true, (c) => c],
    [false, folded],
  ]) {
    const terms = entries
      .filter((e) => (e.case_sensitive !== false) === caseSensitive)
      .map((entry) => ({ entry, chars: codePoints(entry.source).map(fold) }));
    if (!terms.length) continue;
    for (let start = 0; start < chars.length; start++) {
      const match = longestAt(terms, chars, start, fold);
      if (match) found.push(match);
    }
  }
  found.sort((a, b) => b.end - b.start - (a.end - a.start) || a.start - b.start);
  const taken = [];
  for (const match of found) {
    if (taken.every((t) => match.end <= t.start || match.start >= t.end)) taken.push(match);
  }
  return taken.sort((a, b) => a.start - b.start).map((m) => m.entry);
}

// What the service required of a sentence's translation: the entries its terms matched, and
// the kept spans it holds.
export function requiredOf(sentence, entries, kept) {
  const spans = keptIn(sentence, kept);
  return { entries: matchedEntries(masked(sentence, spans), entries), kept: spans };
}

// ---- marking the output --------------------------------------------------------------------

// `text` cut into pieces, each `{text}` or `{text, kind, title}` for a target term of `entries`
// ("term") or a kept span ("kept") found in it: all occurrences, the longer first where two
// overlap, then the earlier.
export function markedPieces(text, entries, kept) {
  const wanted = [
    ...entries.map((e) => ({ needle: e.target, kind: "term", title: `glossary: ${e.source} → ${e.target}` })),
    ...kept.map((span) => ({ needle: span, kind: "kept", title: "kept as written" })),
  ];
  const found = [];
  for (const { needle, kind, title } of wanted) {
    for (let at = text.indexOf(needle); needle && at >= 0; at = text.indexOf(needle, at + 1)) {
      found.push({ start: at, end: at + needle.length, kind, title });
    }
  }
  found.sort((a, b) => b.end - b.start - (a.end - a.start) || a.start - b.start);
  const taken = [];
  for (const mark of found) {
    if (taken.every((t) => mark.end <= t.start || mark.start >= t.end)) taken.push(mark);
  }
  taken.sort((a, b) => a.start - b.start);
  const pieces = [];
  let at = 0;
  for (const { start, end, kind, title } of taken) {
    if (start > at) pieces.push({ text: text.slice(at, start) });
    pieces.push({ text: text.slice(start, end), kind, title });
    at = end;
  }
  if (at < text.length) pieces.push({ text: text.slice(at) });
  return pieces;
}

// The DOM helpers the playground's modules share.

export const $ = (id) => document.getElementById(id);

// An element with attributes ("text" sets its text, never HTML) and children.
export function element(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === "text") node.textContent = value;
    else node.setAttribute(name, value);
  }
  node.append(...children);
  return node;
}

// Model output is untrusted: Markdown is rendered with raw HTML escaped (a <script> or an
// onerror= attribute shows as text), then sanitised again by DOMPurify, which also drops
// javascript: links. Code blocks are highlighted and get a copy button.
import { Marked } from "./vendor/marked.esm.js";
import DOMPurify from "./vendor/purify.es.js";
import hljs from "./vendor/highlight.min.js";

const escapeHtml = (s) => s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

const marked = new Marked({ gfm: true, breaks: false });
marked.use({
  renderer: {
    // Raw HTML in the model's text (block or inline) is shown as text, never parsed.
    html(token) { return escapeHtml(token.text); },
  },
});

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.getAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

const PURIFY = { USE_PROFILES: { html: true }, FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select"], FORBID_ATTR: ["style"] };

/** Fill `target` with `text` rendered as sanitised Markdown. */
export function renderMarkdown(target, text) {
  target.innerHTML = DOMPurify.sanitize(marked.parse(text || ""), PURIFY);
  for (const code of target.querySelectorAll("pre > code")) decorateCode(code);
}

/** Highlight one code element (its text only) and give its <pre> a copy button. */
export function decorateCode(code, language) {
  const text = code.textContent;
  const lang = language || (code.className.match(/language-([\w+-]+)/) || [])[1];
  const result = lang && hljs.getLanguage(lang)
    ? hljs.highlight(text, { language: lang, ignoreIllegals: true })
    : hljs.highlightAuto(text);
  code.innerHTML = result.value;  // highlight.js escapes the text it wraps in spans
  code.classList.add("hljs");
  const pre = code.parentElement;
  if (pre && pre.tagName === "PRE" && !pre.querySelector(".copy")) {
    pre.classList.add("code");
    pre.append(copyButton(() => text, "Copy code"));
  }
}

/** A button that copies `getText()` to the clipboard and says so. */
export function copyButton(getText, label = "Copy") {
  const b = document.createElement("button");
  b.type = "button";
  b.className = "copy";
  b.textContent = label;
  b.setAttribute("aria-label", label);
  b.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(getText());
      b.textContent = "Copied";
    } catch {
      b.textContent = "Copy failed";
    }
    setTimeout(() => { b.textContent = label; }, 1500);
  });
  return b;
}

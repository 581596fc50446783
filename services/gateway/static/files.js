// The Files tab: a read-only look at the workspace (directories, then a file's text,
// highlighted), so the user can see what is there before and after approving a change.
import { decorateCode } from "./markdown.js";

const $ = (id) => document.getElementById(id);

/** Wire the Files tab. `api` is the page's authenticated fetch; `workspace()` names the
 *  workspace to show (the open conversation's, or the picker's for a new one). */
export function initFiles({ api, workspace }) {
  let path = ".";
  let shown = null;  // the workspace last listed

  async function list(dir) {
    const ws = workspace();
    path = dir;
    shown = ws;
    $("files-workspace").textContent = ws;
    $("file-view").hidden = true;
    $("files").hidden = false;
    crumbs(dir);
    let data;
    try {
      data = await api("GET", `/api/workspaces/${encodeURIComponent(ws)}/files?path=${encodeURIComponent(dir)}`);
    } catch (e) {
      $("files").replaceChildren(item(`${e.status === 404 ? "empty (nothing written yet)" : e.message}`));
      return;
    }
    const rows = [];
    if (dir !== ".") rows.push(entry({ name: "..", kind: "dir", path: parent(dir) }));
    for (const e of data.entries) rows.push(entry(e));
    if (!data.entries.length) rows.push(item("empty directory"));
    if (data.truncated) rows.push(item("… more entries not shown"));
    $("files").replaceChildren(...rows);
  }

  async function open(file) {
    const ws = workspace();
    crumbs(file);
    let data;
    try {
      data = await api("GET", `/api/workspaces/${encodeURIComponent(ws)}/file?path=${encodeURIComponent(file)}`);
    } catch (e) {
      $("file-view").replaceChildren(document.createTextNode(e.message));
      $("file-view").hidden = false;
      return;
    }
    const pre = document.createElement("pre");
    const code = document.createElement("code");
    pre.append(code);
    if (data.binary) {
      code.textContent = `binary file, ${data.size} bytes`;
    } else {
      code.textContent = data.text;
      const ext = (file.match(/\.(\w+)$/) || [])[1];
      decorateCode(code, ext);
    }
    const head = document.createElement("div");
    head.className = "file-head";
    head.textContent = `${file} · ${data.size} bytes${data.truncated ? " (first 512 KiB)" : ""}`;
    $("file-view").dataset.path = file;
    $("file-view").replaceChildren(head, pre);
    $("file-view").hidden = false;
    $("files").hidden = true;
  }

  function entry(e) {
    const li = document.createElement("li");
    li.dataset.path = e.path;
    li.dataset.kind = e.kind;
    if (e.kind === "dir" || e.kind === "file") {
      const b = document.createElement("button");
      b.type = "button";
      b.className = "file-entry";
      b.textContent = e.kind === "dir" ? `${e.name}/` : e.name;
      b.addEventListener("click", () => (e.kind === "dir" ? list(e.path) : open(e.path)));
      li.append(b);
      if (e.size != null) li.append(Object.assign(document.createElement("span"), { className: "muted size", textContent: `${e.size} B` }));
    } else {
      li.textContent = `${e.name} (${e.kind}, not followed)`;
      li.className = "muted";
    }
    return li;
  }

  function item(text) {
    const li = document.createElement("li");
    li.className = "muted";
    li.textContent = text;
    return li;
  }

  function crumbs(p) {
    const nav = $("files-path");
    const parts = p === "." ? [] : p.split("/");
    const links = [crumb("workspace", ".")];
    parts.forEach((part, i) => {
      const sub = parts.slice(0, i + 1).join("/");
      links.push(document.createTextNode(" / "), i === parts.length - 1 ? document.createTextNode(part) : crumb(part, sub));
    });
    nav.replaceChildren(...links);
  }

  function crumb(label, dir) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "crumb";
    b.textContent = label;
    b.addEventListener("click", () => list(dir));
    return b;
  }

  const parent = (p) => (p.includes("/") ? p.slice(0, p.lastIndexOf("/")) : ".");

  $("files-refresh").addEventListener("click", () => list(shown === workspace() ? path : "."));
  return {
    /** Show the listing again (same directory if the workspace is the same). */
    refresh() { return list(shown === workspace() ? path : "."); },
  };
}

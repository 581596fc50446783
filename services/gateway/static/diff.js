// A unified diff as a table with old and new line numbers: inline (one column of lines)
// or side by side (old on the left, new on the right, changed lines paired).

const HUNK = /^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@(.*)$/;

function cell(cls, text) {
  const c = document.createElement("td");
  c.className = cls;
  c.textContent = text;
  return c;
}

function row(cls, ...cells) {
  const r = document.createElement("tr");
  r.className = cls;
  r.append(...cells);
  return r;
}

/** Parse a unified diff into lines {kind: hunk|ctx|add|del|meta, text, old, new}. */
function parse(diff) {
  const out = [];
  let oldNo = 0;
  let newNo = 0;
  for (const line of diff.replace(/\n$/, "").split("\n")) {
    if (line.startsWith("--- ") || line.startsWith("+++ ") || line === "") continue;
    const hunk = line.match(HUNK);
    if (hunk) {
      oldNo = Number(hunk[1]);
      newNo = Number(hunk[2]);
      out.push({ kind: "hunk", text: line });
    } else if (line.startsWith("+")) out.push({ kind: "add", text: line, new: newNo++ });
    else if (line.startsWith("-")) out.push({ kind: "del", text: line, old: oldNo++ });
    else if (line.startsWith("\\")) out.push({ kind: "meta", text: line });
    else out.push({ kind: "ctx", text: line, old: oldNo++, new: newNo++ });
  }
  return out;
}

const num = (n) => (n === undefined ? "" : String(n));

/** A <table class="diff"> for `diff`; `split` puts old and new side by side. */
export function renderDiff(diff, split = false) {
  const table = document.createElement("table");
  table.className = split ? "diff split" : "diff";
  const body = document.createElement("tbody");
  const lines = parse(diff);
  if (!split) {
    for (const l of lines) {
      const marks = l.kind === "hunk" ? ["…", "…"] : [num(l.old), num(l.new)];
      body.append(row(l.kind, cell("ln", marks[0]), cell("ln", marks[1]), cell("code", l.text)));
    }
  } else {
    for (let i = 0; i < lines.length;) {
      const l = lines[i];
      if (l.kind === "del" || l.kind === "add") {
        // A run of removed lines then added lines: pair them up row by row.
        const dels = [];
        const adds = [];
        while (i < lines.length && lines[i].kind === "del") dels.push(lines[i++]);
        while (i < lines.length && lines[i].kind === "add") adds.push(lines[i++]);
        for (let k = 0; k < Math.max(dels.length, adds.length); k++) {
          const d = dels[k];
          const a = adds[k];
          body.append(row("pair",
            cell(d ? "ln del" : "ln", d ? num(d.old) : ""), cell(d ? "code del" : "code empty", d ? d.text : ""),
            cell(a ? "ln add" : "ln", a ? num(a.new) : ""), cell(a ? "code add" : "code empty", a ? a.text : "")));
        }
        continue;
      }
      if (l.kind === "hunk" || l.kind === "meta") {
        const c = cell("code", l.text);
        c.colSpan = 4;
        body.append(row(l.kind, c));
      } else {
        body.append(row("ctx", cell("ln", num(l.old)), cell("code", l.text), cell("ln", num(l.new)), cell("code", l.text)));
      }
      i++;
    }
  }
  table.append(body);
  return table;
}

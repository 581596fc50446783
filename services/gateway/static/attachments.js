// Attachments: the composer's Attach button (and files dropped on the composer) upload each
// file at once (POST /api/uploads, the raw file as the body) and show it as a chip; the
// next user_turn carries their ids. A turn's chips come back in its turn_queued event.

const $ = (id) => document.getElementById(id);
// A short kind label, not an emoji: it reads the same on every system, fonts or not.
const KIND_LABEL = { image: "IMG", pdf: "PDF", text: "TXT" };

/** A human size: 812 B, 14.2 KB, 3.1 MB. */
function size(bytes) {
  if (bytes < 1000) return `${bytes} B`;
  if (bytes < 1_000_000) return `${(bytes / 1000).toFixed(1)} KB`;
  return `${(bytes / 1_000_000).toFixed(1)} MB`;
}

/** One chip: kind, name and size of an upload (what turn_queued's `attachments` carry). */
export function chip(a, onRemove) {
  const c = document.createElement("span");
  c.className = `chip ${a.kind || "pending"}`;
  c.dataset.uploadId = a.upload_id || "";
  c.title = a.upload_id ? `${a.name} (${a.kind}, ${size(a.size)})` : a.name;
  const icon = document.createElement("span");
  icon.className = "chip-kind";
  icon.textContent = KIND_LABEL[a.kind] || "FILE";
  icon.setAttribute("aria-hidden", "true");
  const name = document.createElement("span");
  name.className = "chip-name";
  name.textContent = a.name;
  const bytes = document.createElement("span");
  bytes.className = "chip-size muted";
  bytes.textContent = a.upload_id ? size(a.size) : "uploading…";
  c.append(icon, name, bytes);
  if (onRemove) {
    const x = document.createElement("button");
    x.type = "button";
    x.className = "chip-remove";
    x.textContent = "×";
    x.setAttribute("aria-label", `Remove ${a.name}`);
    x.addEventListener("click", onRemove);
    c.append(x);
  }
  return c;
}

/** The chips of a sent turn, for its user message. */
export function chipsOf(attachments) {
  const row = document.createElement("div");
  row.className = "chips sent";
  for (const a of attachments) row.append(chip(a));
  return row;
}

/** Wire the Attach button and drop target. `token()` is the bearer token; `note(text)` tells
 *  the user what went wrong (an upload refused: too large, not a supported kind). */
export function initAttachments({ token, note }) {
  let ready = [];     // uploaded: {upload_id, name, kind, size}
  let pending = 0;    // uploads on their way

  function render() {
    const box = $("chips");
    box.replaceChildren(...ready.map((a) => chip(a, () => { ready = ready.filter((r) => r !== a); render(); })));
    for (let i = 0; i < pending; i++) box.append(chip({ name: "uploading" }));
    box.hidden = ready.length === 0 && pending === 0;
    $("send").disabled = pending > 0;
  }

  async function upload(file) {
    pending += 1;
    render();
    try {
      const res = await fetch(`/api/uploads?name=${encodeURIComponent(file.name)}`, {
        method: "POST",
        headers: { "Authorization": `Bearer ${token()}` },
        body: file,
      });
      const data = await res.json().catch(() => ({}));
      if (!res.ok) throw new Error(data.detail || res.statusText);
      ready.push(data);
    } catch (e) {
      note(`could not attach ${file.name}: ${e.message}`);
    } finally {
      pending -= 1;
      render();
    }
  }

  const input = $("attach-input");
  $("attach").addEventListener("click", () => input.click());
  input.addEventListener("change", () => {
    for (const file of input.files) upload(file);
    input.value = "";
  });
  const composer = $("composer");
  composer.addEventListener("dragover", (ev) => {
    if (!ev.dataTransfer || !Array.from(ev.dataTransfer.types).includes("Files")) return;
    ev.preventDefault();
    composer.classList.add("dropping");
  });
  composer.addEventListener("dragleave", () => composer.classList.remove("dropping"));
  composer.addEventListener("drop", (ev) => {
    composer.classList.remove("dropping");
    if (!ev.dataTransfer || ev.dataTransfer.files.length === 0) return;
    ev.preventDefault();
    for (const file of ev.dataTransfer.files) upload(file);
  });
  render();

  return {
    /** The ids to send with the next turn (none while an upload is still on its way). */
    ids: () => ready.map((a) => a.upload_id),
    busy: () => pending > 0,
    clear: () => { ready = []; render(); },
  };
}

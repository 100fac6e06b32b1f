"use strict";
// The duplicates view (/duplicates): groups from GET /v1/duplicates, side-by-side comparison with the matched
// regions, "keep this one" selecting the rest of a group, and a confirmed DELETE /v1/images/{id} per image.
const $ = (id) => document.getElementById(id);
const KEY_STORE = "regis.apiKey";  // the same entry as the search page's
const SVGNS = "http://www.w3.org/2000/svg";
const COLOURS = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#0fb9b1", "#f032e6", "#9a6324", "#808000", "#000075"];
const WORDS = { exact: "exact copy", edited_copy: "edited copy", crop: "crop", same_scene: "same scene" };
const MESSAGES = {
  index_unavailable: "The server has no index yet.",
  collection_not_found: "That collection does not exist.",
  not_supported: "This collection cannot be searched for duplicates (sharded collections are not supported yet).",
  image_not_found: "That image is no longer in the index.",
  jobs_disabled: "This server is read-only: it does not delete images (REGIS_ENABLE_JOBS is off).",
};

// page: the page of groups shown; data: the last answer; kept: group index -> kept image id;
// marked: ids selected for deletion
const state = { page: 0, data: null, kept: new Map(), marked: new Set(), polling: null, pair: null };

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}
function showError(message) { const e = $("error"); e.textContent = message; e.hidden = !message; }
function apiKey() { return $("apiKey").value.trim(); }
function apiFetch(url, opts = {}) {
  const key = apiKey();
  return fetch(url, key ? { ...opts, headers: { ...(opts.headers || {}), "X-API-Key": key } } : opts);
}
function keyMessage(status) {
  $("keyBox").hidden = false;
  if (status === 403) return "Key refused: deleting images needs an API key with write scope (regis keys create --scope write).";
  return apiKey() ? "Key refused: the server does not accept this API key (unknown or revoked)."
    : "This server needs an API key: enter one in the API key field (an administrator makes one with 'regis keys create').";
}
async function errorText(resp) {
  if (resp.status === 401 || resp.status === 403) return keyMessage(resp.status);
  let body = null;
  try { body = await resp.json(); } catch (_) { /* not JSON */ }
  const err = body && body.error;
  if (!err) return `The server answered ${resp.status} ${resp.statusText || ""}`.trim() + ".";
  const friendly = MESSAGES[err.code];
  return friendly ? `${friendly} (${err.message})` : err.message;
}
/** Show a /v1 image in ``img``: with a key the bytes are fetched with the header and shown as a blob URL. */
async function showImage(img, url, fallback = null) {
  img.dataset.want = url;
  if (!apiKey()) {
    img.onerror = fallback ? () => { img.onerror = null; img.src = fallback; } : null;
    img.src = url;
    return;
  }
  try {
    let resp = await apiFetch(url);
    if (!resp.ok && fallback) resp = await apiFetch(fallback);
    if (!resp.ok || img.dataset.want !== url) return;
    const blob = await resp.blob();
    if (img.dataset.want === url) img.src = URL.createObjectURL(blob);
  } catch (_) { /* unreachable server: the image stays empty */ }
}
function base() {
  const opt = $("collection").selectedOptions[0];
  return opt && opt.dataset.default !== "true" ? `/v1/collections/${encodeURIComponent(opt.value)}` : "/v1";
}
function thumb(img, id) { showImage(img, `${base()}/images/${id}/thumbnail?size=256`, `${base()}/images/${id}/file`); }

$("apiKey").value = localStorage.getItem(KEY_STORE) || "";
if ($("apiKey").value) $("keyBox").hidden = false;
$("apiKey").addEventListener("change", () => {
  const key = apiKey();
  if (key) localStorage.setItem(KEY_STORE, key); else localStorage.removeItem(KEY_STORE);
  showError("");
  loadCollections().then(find);
});

async function loadCollections() {
  let resp;
  try { resp = await apiFetch("/v1/collections"); } catch (_) { return; }
  if (resp.status === 401 || resp.status === 403) { showError(keyMessage(resp.status)); return; }
  const body = resp.ok ? await resp.json().catch(() => null) : null;
  const list = (body && body.collections) || [];
  const chosen = $("collection").value || new URLSearchParams(location.search).get("collection");
  $("collection").replaceChildren();
  $("collectionBox").hidden = list.length < 2;
  for (const c of list) {
    const opt = el("option", { value: c.name }, `${c.name} (${c.images} images)`);
    opt.dataset.default = String(Boolean(c.default));
    opt.selected = chosen ? c.name === chosen : Boolean(c.default);
    $("collection").append(opt);
  }
}

// ------------------------------------------------------------------ finding
function relations() {
  const out = ["exact", "edited_copy"];
  if ($("showCrops").checked) out.push("crop");
  if ($("showScenes").checked) out.push("same_scene");
  return out;
}
function query(extra = {}) {
  const size = Number($("pageSize").value);
  const params = new URLSearchParams({ offset: String(state.page * size), limit: String(size), wait: "5", ...extra });
  for (const r of relations()) params.append("relation", r);
  return params;
}

async function find() {
  clearTimeout(state.polling);
  showError("");
  $("findBtn").disabled = true;
  $("status").textContent = state.data ? "Updating..." : "Finding duplicates...";
  let resp;
  try { resp = await apiFetch(`${base()}/duplicates?${query()}`); } catch (_) {
    $("findBtn").disabled = false; $("status").textContent = ""; showError("The server could not be reached."); return;
  }
  if (resp.status === 202) {  // the pairs of this index version are still being computed
    const p = await resp.json();
    const stage = p.stage === "verify" ? "verifying pairs" : "searching images";
    $("status").textContent = `Index version ${p.index_version}: ${stage}` + (p.total ? ` (${p.done} of ${p.total})` : "") +
      "... the first run on a collection searches every image; later runs only the new ones.";
    state.polling = setTimeout(find, 1500);
    return;
  }
  $("findBtn").disabled = false;
  if (!resp.ok) { $("status").textContent = ""; $("groups").replaceChildren(); showError(await errorText(resp)); return; }
  state.data = await resp.json();
  render();
}

function summary(d) {
  const c = d.counts, p = c.pairs;
  const parts = [`Index version ${d.index_version}: ${c.duplicate_groups} duplicate groups (${c.images_in_duplicate_groups} images; ` +
    `${c.redundant_images} could go, keeping one per group)`];
  const n = (k, one, many) => `${k} ${k === 1 ? one : many}`;
  parts.push(`${p.exact} exact and ${n(p.edited_copy, "edited-copy pair", "edited-copy pairs")}, ` +
    `${n(p.crop, "crop pair", "crop pairs")}, ${n(p.same_scene, "same-scene pair", "same-scene pairs")}`);
  if (!d.calibrated) parts.push("the thresholds are not calibrated for this index's encoder");
  return parts.join("; ") + ".";
}

function render() {
  const d = state.data;
  $("status").textContent = summary(d);
  const box = $("groups");
  box.replaceChildren();
  if (!d.groups.length) box.append(el("p", { class: "muted" }, d.offset ? "No more groups." : "No duplicates found."));
  d.groups.forEach((g, i) => box.append(groupNode(g, d.offset + i)));
  refreshMarks();
  const size = Number($("pageSize").value);
  $("pager").hidden = d.total_groups <= size;
  $("prev").disabled = state.page === 0;
  $("next").disabled = d.offset + d.groups.length >= d.total_groups;
  $("pageInfo").textContent = `groups ${d.offset + 1}-${d.offset + d.groups.length} of ${d.total_groups}`;
  updateSelection();
}

/** What image ``id`` is to ``other`` (a pair of the group), in words. */
function relationTo(pair, id) {
  const other = pair.a === id ? pair.b : pair.a;
  if (pair.relation === "crop") return pair.contains === other ? `crop of #${other}` : `contains #${other}`;
  return `${WORDS[pair.relation]} of #${other}`;
}
function bestPair(pairs, id, prefer) {
  const mine = pairs.filter(p => p.a === id || p.b === id);
  return mine.find(p => p.a === prefer || p.b === prefer) ||
    mine.sort((x, y) => Math.max(y.scores.a_to_b, y.scores.b_to_a) - Math.max(x.scores.a_to_b, x.scores.b_to_a))[0];
}

function card(img, note, pair, group, index, member) {
  const pic = el("img", { alt: img.path || `image ${img.id}`, loading: "lazy" });
  thumb(pic, img.id);
  const actions = el("span", { class: "actions" });
  if (pair) actions.append(el("button", { class: "cmp", onclick: () => openCompare(pair, group, index) }, "Compare"));
  if (member) {
    const keep = el("input", { type: "radio", name: `keep-${index}`, class: "keep" });
    keep.checked = state.kept.get(index) === img.id;
    keep.addEventListener("change", () => keepThis(group, index, img.id));
    const del = el("input", { type: "checkbox", class: "del" });
    del.checked = state.marked.has(img.id);
    del.addEventListener("change", () => { del.checked ? state.marked.add(img.id) : state.marked.delete(img.id); refreshMarks(); });
    actions.append(el("label", { title: "keep this one and select the rest of the group for deletion" }, keep, "keep this one"),
                   el("label", { title: "select for deletion" }, del, "delete"));
  }
  const relClass = pair ? pair.relation : "";
  const cap = el("figcaption", {},
    el("span", { class: "name", title: img.path || "" }, `#${img.id} ${img.path || "(gone)"}`),
    el("span", { class: "muted num" }, img.width ? `${img.width} x ${img.height}, ${Math.round(img.bytes / 1024)} KB` : ""),
    el("span", { class: `rel ${relClass}` }, note), actions);
  const fig = el("figure", { class: "card", "data-id": String(img.id) }, pic, cap);
  return fig;
}

function groupNode(g, index) {
  const keepId = state.kept.has(index) ? state.kept.get(index) : g.keep;
  const dup = g.images.length > 1;
  const head = el("h2", {}, dup ? `Group ${index + 1}: ${g.images.length} copies` : `Group ${index + 1}: one image`,
    el("small", {}, dup ? `suggested to keep: #${g.keep} (the central, largest one)` : "with crops or other shots beside it"));
  const strip = el("div", { class: "strip" });
  const ordered = [...g.images].sort((x, y) => (y.id === keepId) - (x.id === keepId));
  for (const img of ordered) {
    const pair = img.id === keepId ? null : bestPair(g.pairs, img.id, keepId);
    const note = img.id === keepId ? (dup ? (state.kept.has(index) ? "kept" : "suggested to keep") : "")
      : (pair ? relationTo(pair, img.id) : "");
    strip.append(card(img, note, pair, g, index, dup));
  }
  const node = el("section", { class: "group", "data-group": String(index) }, head, strip);
  if (g.related.length) {
    const rel = el("div", { class: "strip related" }, el("p", { class: "label" }, "Beside the group (not duplicates):"));
    for (const img of g.related_images) {
      const pair = bestPair(g.related, img.id, keepId);
      rel.append(card(img, pair ? relationTo(pair, img.id) : "", pair, g, index, false));
    }
    node.append(rel);
  }
  return node;
}

// ------------------------------------------------------------------ keep this one, delete
function keepThis(group, index, id) {
  state.kept.set(index, id);
  for (const img of group.images) { if (img.id === id) state.marked.delete(img.id); else state.marked.add(img.id); }
  render();  // the kept one first, the others' relations said to it
}
function refreshMarks() {
  document.querySelectorAll("#groups .group").forEach(node => {
    const index = Number(node.dataset.group);
    node.querySelectorAll(".card").forEach(c => {
      const id = Number(c.dataset.id);
      c.classList.toggle("kept", state.kept.get(index) === id);
      c.classList.toggle("marked", state.marked.has(id));
      const del = c.querySelector("input.del");
      if (del) del.checked = state.marked.has(id);
      const keep = c.querySelector("input.keep");
      if (keep) keep.checked = state.kept.get(index) === id;
    });
  });
  updateSelection();
}
function updateSelection() {
  const n = state.marked.size;
  $("selection").hidden = n === 0;
  $("selectionText").textContent = `${n} image${n === 1 ? "" : "s"} selected for deletion`;
}
$("clearBtn").addEventListener("click", () => { state.marked.clear(); state.kept.clear(); refreshMarks(); });
$("deleteBtn").addEventListener("click", () => {
  const ids = [...state.marked];
  const known = new Map();
  (state.data ? state.data.groups : []).forEach(g => g.images.forEach(i => known.set(i.id, i.path)));
  $("confirmTitle").textContent = `Delete ${ids.length} image${ids.length === 1 ? "" : "s"} from the index?`;
  $("confirmText").textContent = "Each is removed from the index (an uploaded file is deleted with it; an image indexed " +
    "from a folder comes back at the next scan of that folder unless its file is removed). This cannot be undone.";
  $("confirmList").replaceChildren(...ids.map(id => el("li", {}, `#${id} ${known.get(id) || ""}`)));
  $("confirm").showModal();
});
$("confirmNo").addEventListener("click", () => $("confirm").close());
$("confirmYes").addEventListener("click", async () => {
  $("confirm").close();
  const ids = [...state.marked];
  let done = 0;
  for (const id of ids) {
    $("status").textContent = `Deleting #${id} (${done + 1} of ${ids.length})...`;
    let resp;
    try { resp = await apiFetch(`${base()}/images/${id}`, { method: "DELETE" }); } catch (_) {
      showError("The server could not be reached."); break;
    }
    if (!resp.ok && resp.status !== 404) { showError(`Image #${id} was not deleted: ${await errorText(resp)}`); break; }
    state.marked.delete(id);
    done += 1;
  }
  state.kept.clear();
  $("status").textContent = `${done} image${done === 1 ? "" : "s"} deleted.`;
  if (done) find(); else updateSelection();
});

// ------------------------------------------------------------------ side by side
/** "image 7 is a crop of image 3" -> "Image #7 is a crop of image #3": every image number marked as an id. */
function withIds(words) {
  const text = words.replace(/\b(images?|and|of|in) (\d+)\b(?! ?%)/g, (m, w, id) => `${w} #${id}`);
  return text.charAt(0).toUpperCase() + text.slice(1);
}
/** Both images of the comparison as large as their pane allows (a small copy is enlarged like its partner), the
 * outline layer following. */
function fitStage(img) {
  if (!img.naturalWidth) return;
  const pane = img.closest(".pane");
  const f = Math.min(pane.clientWidth / img.naturalWidth, (window.innerHeight * 0.55) / img.naturalHeight);
  img.style.width = `${Math.round(img.naturalWidth * f)}px`;
  img.style.height = `${Math.round(img.naturalHeight * f)}px`;
}
for (const id of ["aImg", "bImg"]) $(id).addEventListener("load", () => fitStage($(id)));

function setupSvg(svg, w, h) {
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("preserveAspectRatio", "none");
}
function polygon(svg, quad, w, h, label) {
  const poly = document.createElementNS(SVGNS, "polygon");
  poly.setAttribute("points", quad.map(([x, y]) => `${x * w},${y * h}`).join(" "));
  poly.append(Object.assign(document.createElementNS(SVGNS, "title"), { textContent: label }));
  svg.append(poly);
}
function box(svg, b, colour) {
  const r = document.createElementNS(SVGNS, "rect");
  Object.entries({ x: b[0], y: b[1], width: b[2] - b[0], height: b[3] - b[1], stroke: colour, fill: colour, class: "tok" })
    .forEach(([k, v]) => r.setAttribute(k, v));
  svg.append(r);
}
function imageOf(group, id) {
  return group.images.concat(group.related_images).find(i => i.id === id) || { id, width: 1, height: 1, path: null };
}

function openCompare(pair, group, index) {
  state.pair = { pair, group, index };
  const a = imageOf(group, pair.a), b = imageOf(group, pair.b);
  $("cmpTitle").textContent = `#${pair.a} and #${pair.b}: ${WORDS[pair.relation]}`;
  $("cmpWords").textContent = withIds(pair.words) + ".";
  $("aHead").textContent = `#${a.id} ${a.path || ""} (${a.width} x ${a.height})`;
  $("bHead").textContent = `#${b.id} ${b.path || ""} (${b.width} x ${b.height})`;
  showImage($("aImg"), `${base()}/images/${a.id}/file`);
  showImage($("bImg"), `${base()}/images/${b.id}/file`);
  setupSvg($("aSvg"), a.width, a.height);
  setupSvg($("bSvg"), b.width, b.height);
  const rows = [["MaxSim per token", `#${pair.a} in #${pair.b}: ${pair.scores.a_to_b.toFixed(3)}, #${pair.b} in #${pair.a}: ${pair.scores.b_to_a.toFixed(3)}`]];
  if (pair.geometry) {
    const geo = pair.geometry;
    polygon($("aSvg"), geo.b_region_in_a, a.width, a.height, `where #${b.id} lies in #${a.id}`);
    polygon($("bSvg"), geo.a_region_in_b, b.width, b.height, `where #${a.id} lies in #${b.id}`);
    rows.push(["matched regions", `${Math.round(geo.a_in_b * 100)}% of #${pair.a} lies in #${pair.b}; it covers ${Math.round(geo.b_covered * 100)}% of #${pair.b}`]);
    rows.push(["local features", `${geo.inliers} of ${geo.matches} matches agree on one homography`]);
  } else if (pair.relation === "crop" && pair.template) {
    const [x0, y0, x1, y1] = pair.template.window, inA = pair.contains === pair.a;
    const quad = [[x0, y0], [x1, y0], [x1, y1], [x0, y1]], inner = inA ? b : a, outer = inA ? a : b;
    polygon($(inA ? "aSvg" : "bSvg"), quad, outer.width, outer.height, `where #${inner.id} lies in #${outer.id}`);
    rows.push(["matched regions", `found by template search: #${inner.id}, scaled, matches a window of #${outer.id} (correlation ${Math.max(pair.template.a_in_b_ncc, pair.template.b_in_a_ncc).toFixed(2)}; too few matching features for the geometry)`]);
  } else {
    rows.push(["matched regions", "not verified geometrically (no files to compare, or too few matching features): the relation comes from the token scores"]);
  }
  $("cmpFacts").replaceChildren(...rows.map(([k, v]) => el("tr", {}, el("td", { class: "muted" }, k), el("td", {}, v))));
  $("tokensBtn").disabled = false;
  showCompareError("");
  $("compare").showModal();
}

// The framing a two-framing index's pair was compared on (``explanation.framing``), in words.
const FRAMING_WORDS = {
  crop: "each image's centre crop (its central square), matched in the whole of the other image",
  whole: "the whole image",
};
/** Whether query token ``m`` of an explanation counts towards the pair's score: on an index of two framings only the
 * tokens of the framing the explanation names (their names start "crop-" or "whole-"; the other framing's
 * contribute 0); on an index of one framing (``framing`` null) every token. */
function counts(ex, m) {
  return !ex.framing || ex.a_tokens[m.query_token].name.startsWith(`${ex.framing}-`);
}

/** An error of the comparison, said in the dialog (the page's own error line is behind it); "" hides it. */
function showCompareError(message) { const e = $("cmpError"); e.textContent = message; e.hidden = !message; }

/** The token explanation of the open pair (GET .../duplicates?explain=true for its group): each image's ROI boxes and,
 * on the other image, the box of the token each one matched best, in one colour per token; on an index of two
 * framings only the tokens of the framing the pair was scored on, said in words. The answer is for the comparison
 * open when the button was pressed: if another pair was opened (or the dialog closed) meanwhile it is dropped, never
 * drawn on the other pair. A failure is said in the dialog and the button can be pressed again. */
async function showTokens() {
  const open = state.pair;  // this request's comparison: openCompare and closing replace it
  const stale = () => state.pair !== open;
  const fail = (message) => {
    if (stale()) return;
    showCompareError(message);
    $("tokensBtn").disabled = false;
  };
  const { pair, index } = open;
  $("tokensBtn").disabled = true;
  showCompareError("");
  const params = query({ offset: String(index), limit: "1", explain: "true" });
  let body;
  try {
    const resp = await apiFetch(`${base()}/duplicates?${params}`);
    if (stale()) return;
    if (!resp.ok) { fail(await errorText(resp)); return; }
    body = await resp.json();
  } catch (_) { fail("The server could not be reached."); return; }
  if (stale()) return;
  const g = body.groups && body.groups[0];
  const found = g && g.pairs.concat(g.related).find(p => p.a === pair.a && p.b === pair.b);
  const ex = found && found.explanation;
  if (!ex) { fail("No explanation for this pair (an image was deleted meanwhile)."); return; }
  ex.a_to_b.matches.filter(m => counts(ex, m)).forEach((m, i) => {
    const colour = COLOURS[i % COLOURS.length];
    const qb = ex.a_tokens[m.query_token].box;
    if (qb && m.result_box) { box($("aSvg"), qb, colour); box($("bSvg"), m.result_box, colour); }
  });
  if (ex.framing) {
    const words = FRAMING_WORDS[ex.framing] || `the ${ex.framing} framing`;
    $("cmpFacts").append(el("tr", { id: "cmpFraming" }, el("td", { class: "muted" }, "token matches"),
      el("td", {}, `compared on ${words}: the tokens the pair's scores come from; the other framing's tokens of ` +
        "the image on the left are not part of them and are not drawn")));
  }
}
$("tokensBtn").addEventListener("click", showTokens);
$("cmpClose").addEventListener("click", () => $("compare").close());
$("compare").addEventListener("close", () => {  // an answer still on its way for the closed pair is dropped
  if (!$("compare").open) state.pair = null;
});
$("compare").addEventListener("click", (e) => { if (e.target === $("compare")) $("compare").close(); });

// ------------------------------------------------------------------ controls
$("findBtn").addEventListener("click", () => { state.page = 0; find(); });
$("prev").addEventListener("click", () => { state.page = Math.max(0, state.page - 1); state.kept.clear(); find(); });
$("next").addEventListener("click", () => { state.page += 1; state.kept.clear(); find(); });
for (const id of ["pageSize", "showCrops", "showScenes", "collection"]) {
  $(id).addEventListener("change", () => { state.page = 0; state.kept.clear(); state.marked.clear(); find(); });
}
loadCollections().then(find);

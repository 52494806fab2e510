// abridge console: live job progress over the API's event streams, and a session's new
// summary swapped in when its refresh ends. Every page works without this file.
"use strict";
(function () {
  const main = document.getElementById("main");
  if (!main || !window.fetch) return;
  const csrf = main.dataset.csrf;
  const ENDS = ["job.succeeded", "job.failed", "job.cancelled"];
  const bars = new Map(); // job id -> the element holding its bar

  function text(el, sel, value) {
    const t = el.querySelector(sel);
    if (t) t.textContent = value;
  }

  // Show a job's state and progress in its bar; `started` (ms) gives the ETA.
  function paint(el, state, done, total) {
    const max = Math.max(total || 0, 1);
    if (state === "succeeded") done = max;
    done = Math.min(done || 0, max);
    const percent = Math.floor((100 * done) / max) + " %";
    const bar = el.querySelector("progress");
    if (bar) { bar.max = max; bar.value = done; bar.textContent = percent; }
    el.dataset.state = state;
    text(el, ".job-state", state);
    text(el, ".job-count", done + "/" + (total || (state === "succeeded" ? 1 : 0)));
    text(el, ".job-percent", percent);
    const started = Number(el.dataset.started || 0);
    let eta = "";
    if (state === "running" && started && done > 0 && done < max) {
      eta = "about " + Math.ceil((((Date.now() - started) / done) * (max - done)) / 1000) + " s left";
    }
    text(el, ".job-eta", eta);
    if (state !== "queued" && state !== "running") {
      const cancel = document.querySelector("#job-" + el.dataset.jobId + " form");
      if (cancel) cancel.remove();
    }
  }

  function fromJob(el, job) {
    if (job.started_ms) el.dataset.started = job.started_ms;
    const p = job.progress || {};
    if (p.stage) text(el, ".job-stage", p.level ? p.stage + " (level " + p.level + ")" : p.stage);
    paint(el, job.state, p.done, p.total);
  }

  function onEvent(el, kind, e) {
    const d = e.data || {};
    if (kind === "job.state") {
      fromJob(el, d);
      if (d.state === "succeeded" && el.dataset.session) reloadChain(el.dataset.session);
    }
    else if (kind === "job.running") { el.dataset.started = e.at_ms || Date.now(); paint(el, "running", 0, 0); }
    else if (kind === "job.progress") {
      text(el, ".job-stage", d.level ? d.stage + " (level " + d.level + ")" : d.stage);
      paint(el, "running", d.done, d.total);
    } else if (ENDS.includes(kind)) {
      const bar = el.querySelector("progress");
      paint(el, kind.slice(4), Number(bar ? bar.value : 0), Number(bar ? bar.max : 1));
      if (kind === "job.succeeded" && el.dataset.session) reloadChain(el.dataset.session);
    }
  }

  // One job's stream: its state now, then its changes, ending with its end (no race with
  // what happened before the stream opened).
  function follow(el) {
    if (!window.EventSource) return;
    const src = new EventSource("/jobs/" + el.dataset.jobId + "/events");
    ["job.state", "job.running", "job.progress"].concat(ENDS).forEach((k) =>
      src.addEventListener(k, (m) => {
        let e;
        try { e = JSON.parse(m.data); } catch (_) { return; }
        if (k === "job.state") e = { data: e };
        onEvent(el, k, e);
        if (ENDS.includes(k) || (k === "job.state" && !["queued", "running"].includes(e.data.state))) src.close();
      }));
  }

  // Every job of the tenant (the jobs page): one stream, and once it is open the page is read
  // again, so a job that ended before the stream opened is shown as it is.
  function followAll() {
    if (!window.EventSource) return;
    const src = new EventSource("/events");
    ["job.running", "job.progress"].concat(ENDS).forEach((k) =>
      src.addEventListener(k, (m) => {
        let e;
        try { e = JSON.parse(m.data); } catch (_) { return; }
        const el = bars.get(e.job);
        if (el) onEvent(el, k, e);
      }));
    src.addEventListener("open", async () => {
      const r = await fetch(location.href, { headers: { Accept: "text/html" } }).catch(() => null);
      if (!r || !r.ok) return;
      const doc = new DOMParser().parseFromString(await r.text(), "text/html");
      doc.querySelectorAll(".job[data-job-id]").forEach((fresh) => {
        const el = bars.get(Number(fresh.dataset.jobId));
        const bar = fresh.querySelector("progress");
        if (el && fresh.dataset.state !== el.dataset.state && bar) {
          paint(el, fresh.dataset.state, Number(bar.value), Number(bar.max));
        }
      });
    }, { once: true });
  }

  async function reloadChain(session) {
    const section = document.querySelector("[data-chain-for]");
    if (!section || section.dataset.chainFor !== session) return;
    const before = new Set([...section.querySelectorAll("[data-row]")].map((e) => e.dataset.row));
    const r = await fetch("/sessions/" + encodeURIComponent(session) + "/chain", { headers: { Accept: "text/html" } });
    if (!r.ok) return;
    section.innerHTML = await r.text();
    section.querySelectorAll("[data-row]").forEach((e) => { if (!before.has(e.dataset.row)) e.classList.add("new"); });
  }

  function barFor(job) {
    const el = document.createElement("div");
    el.className = "job";
    el.dataset.jobId = job.id;
    el.innerHTML = '<p><a></a> · <span class="job-state"></span> · <span class="job-stage"></span> ' +
      '<span class="job-count"></span> <span class="job-eta"></span></p>' +
      '<progress class="bar" max="1" value="0"></progress> <span class="job-percent"></span>';
    const a = el.querySelector("a");
    a.href = "/jobs#job-" + job.id;
    a.textContent = "Job " + job.id;
    el.querySelector("progress").setAttribute("aria-label", "Job " + job.id + " progress");
    fromJob(el, job);
    return el;
  }

  document.querySelectorAll(".job[data-job-id]").forEach((el) => {
    const live = el.closest("#live-job");
    if (live) el.dataset.session = live.dataset.session;
    bars.set(Number(el.dataset.jobId), el);
  });
  const active = [...bars.values()].filter((el) => ["queued", "running"].includes(el.dataset.state));
  if (document.getElementById("jobs")) { if (active.length) followAll(); }
  else active.forEach(follow);

  // "Refresh now" without leaving the page: the job's bar appears here and follows it.
  const form = document.querySelector("form[data-live-refresh]");
  if (form) {
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const live = document.getElementById("live-job");
      const r = await fetch(form.action, {
        method: "POST",
        headers: { Accept: "application/json", "Content-Type": "application/x-www-form-urlencoded" },
        body: new URLSearchParams({ csrf: csrf }),
      }).catch(() => null);
      if (!r) { live.textContent = "The server could not be reached."; return; }
      const body = await r.json().catch(() => ({}));
      if (!r.ok) {
        live.textContent = (body.error && body.error.message) || "The refresh was refused (" + r.status + ").";
        return;
      }
      if (!body.job) { live.textContent = "Nothing to refresh: every message is already covered."; return; }
      if (bars.has(body.job.id)) return;
      const el = barFor(body.job);
      el.dataset.session = form.dataset.liveRefresh;
      live.replaceChildren(el);
      bars.set(body.job.id, el);
      follow(el);
    });
  }
})();

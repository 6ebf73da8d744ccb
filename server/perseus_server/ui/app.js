// Perseus operator's page: jobs, frontiers, plans, stragglers, the power budget and measured
// power, refreshed every few seconds from the REST API. No build step, no dependencies: the
// server ships this file as is. Every value from the API is written as text (textContent),
// never parsed as HTML.
"use strict";

(function () {
  const TOKEN_KEY = "perseus.token";
  const SVG = "http://www.w3.org/2000/svg";
  const MAX_JOB_PAGES = 20;
  const params = new URLSearchParams(window.location.search);
  const refreshSeconds = Math.min(60, Math.max(0.5, Number(params.get("refresh")) || 3));
  // The API's root: the page is served at <root>/ui.
  const root = window.location.pathname.replace(/\/ui\/?$/, "");
  const authRequired =
    (document.querySelector('meta[name="perseus-auth"]') || {}).content === "required";
  const frontiers = new Map(); // job id -> {key, points, t0, e0}
  let timer = null;
  let busy = false;

  class Unauthorized extends Error {}

  function $(id) {
    return document.getElementById(id);
  }

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = String(text);
    return e;
  }

  function num(x, digits) {
    return typeof x === "number" && isFinite(x) ? x.toFixed(digits) : "–";
  }

  function watts(x) {
    return typeof x === "number" ? num(x, 1) + " W" : "–";
  }

  function joules(x) {
    if (typeof x !== "number") return "–";
    if (Math.abs(x) >= 1e6) return num(x / 1e6, 3) + " MJ";
    if (Math.abs(x) >= 1e3) return num(x / 1e3, 3) + " kJ";
    return num(x, 1) + " J";
  }

  function pct(x) {
    return typeof x === "number" ? num(100 * x, 2) + " %" : "–";
  }

  // A value cell: the formatted text, and the raw number in data-value.
  function value(tag, cls, raw, text) {
    const e = el(tag, { class: cls }, text);
    if (typeof raw === "number") e.setAttribute("data-value", String(raw));
    return e;
  }

  function token() {
    return window.sessionStorage.getItem(TOKEN_KEY);
  }

  async function api(path) {
    const headers = { Accept: "application/json" };
    const t = token();
    if (t) headers.Authorization = "Bearer " + t;
    const r = await fetch(root + path, { headers, cache: "no-store" });
    if (r.status === 401) throw new Unauthorized("the credential was refused");
    if (!r.ok) {
      let detail = r.statusText;
      try {
        detail = (await r.json()).detail || detail;
      } catch (e) {
        /* not a problem document */
      }
      throw new Error(`GET ${path}: ${r.status} ${detail}`);
    }
    return r.json();
  }

  function askForCredential(why) {
    window.sessionStorage.removeItem(TOKEN_KEY);
    if (why) $("login-why").textContent = why;
    $("login").hidden = false;
    $("token").focus();
  }

  async function jobs() {
    const out = [];
    let after = null;
    for (let i = 0; i < MAX_JOB_PAGES; i++) {
      const q = "/jobs?limit=100" + (after ? "&after=" + encodeURIComponent(after) : "");
      const page = await api(q);
      out.push(...page.jobs);
      if (!page.next) break;
      after = page.next;
    }
    return out;
  }

  async function frontierOf(job, status) {
    const f = status.frontier;
    if (!f || (f.status !== "done" && !f.num_points)) return null;
    const key = `${f.finished}|${f.num_points}|${job.profile ? job.profile.revision : 0}`;
    const known = frontiers.get(job.id);
    if (known && known.key === key) return known;
    const doc = await api(`/jobs/${encodeURIComponent(job.id)}/frontier`);
    if (!doc.points || !doc.points.length) return null;
    const got = {
      key,
      points: doc.points,
      t0: doc.max_frequency_time,
      e0: doc.max_frequency_energy,
    };
    frontiers.set(job.id, got);
    return got;
  }

  async function refresh() {
    if (busy) return;
    busy = true;
    try {
      if (authRequired && !token()) {
        askForCredential();
        return;
      }
      const list = await jobs();
      const details = await Promise.all(
        list.map(async (job) => {
          const status = await api(`/jobs/${encodeURIComponent(job.id)}/status`);
          const frontier = await frontierOf(job, status);
          return { job, status, frontier };
        }),
      );
      const live = new Set(list.map((j) => j.id));
      for (const id of Array.from(frontiers.keys())) if (!live.has(id)) frontiers.delete(id);
      // Shown while an active job has a share (idle and finished ones are listed as left out).
      const budgeted = details.some((d) => d.status.power_budget);
      const budget = budgeted ? await api("/power-budget") : null;
      renderBudget(budget, details);
      renderJobs(details);
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
      $("error").hidden = true;
      document.body.setAttribute("data-loaded", String(Number(document.body.dataset.loaded || 0) + 1));
    } catch (e) {
      if (e instanceof Unauthorized) {
        askForCredential("The credential was refused; type another one.");
      } else {
        $("error").textContent = String(e.message || e);
        $("error").hidden = false;
      }
    } finally {
      busy = false;
      schedule();
    }
  }

  function schedule() {
    if (timer !== null) window.clearTimeout(timer);
    timer = $("login").hidden ? window.setTimeout(refresh, refreshSeconds * 1000) : null;
  }

  // --- the power budget ------------------------------------------------------------------------

  function renderBudget(budget, details) {
    const sec = $("budget");
    if (!budget) {
      sec.hidden = true;
      return;
    }
    sec.hidden = false;
    const names = new Map(details.map((d) => [d.job.id, d.job.name]));
    $("budget-watts").textContent = watts(budget.watts);
    $("budget-watts").setAttribute("data-value", String(budget.watts));
    $("budget-policy").textContent = budget.policy;
    $("budget-allocated").textContent = watts(budget.allocated_watts);
    $("budget-allocated").setAttribute("data-value", String(budget.allocated_watts));
    $("budget-feasible").textContent = budget.feasible
      ? "feasible"
      : `INFEASIBLE: the jobs need at least ${watts(budget.lowest_power)} ` +
        `(${watts(budget.over_by)} over); on_infeasible ${budget.on_infeasible}`;
    $("budget-feasible").className = budget.feasible ? "" : "error";
    $("budget-feasible").setAttribute("data-feasible", String(budget.feasible));
    const out = budget.left_out || [];
    $("budget-left-out").textContent = out.length
      ? "left out: " + out.map((j) => `${names.get(j.job) || j.job} (${j.why})`).join(", ")
      : "";
    $("budget-gap").textContent =
      typeof budget.gap === "number" && budget.gap > 0 ? `(gap ${pct(budget.gap)})` : "";
    const body = $("allocation").querySelector("tbody");
    body.replaceChildren();
    for (const j of budget.jobs) {
      const tr = el("tr", { "data-job": j.id });
      tr.append(
        el("td", { class: "mono" }, names.get(j.id) ? `${names.get(j.id)} (${j.id})` : j.id),
        value("td", "alloc-watts", j.watts, watts(j.watts)),
        shareCell(j.watts, budget.watts),
        value("td", "alloc-slowdown", j.slowdown, pct(j.slowdown)),
        el("td", { class: "alloc-point" }, j.point),
      );
      body.append(tr);
    }
  }

  function shareCell(w, total) {
    const td = el("td", { class: "share" });
    const frac = total > 0 ? Math.max(0, Math.min(1, w / total)) : 0;
    const bar = svg("svg", { width: 120, height: 10, class: "bar", role: "img" });
    bar.append(svg("rect", { x: 0, y: 0, width: 120, height: 10, class: "bar-bg" }));
    bar.append(svg("rect", { x: 0, y: 0, width: (120 * frac).toFixed(1), height: 10, class: "bar-fg" }));
    bar.append(svg("title", {}, pct(frac) + " of the budget"));
    td.append(bar);
    return td;
  }

  // --- jobs ------------------------------------------------------------------------------------

  function renderJobs(details) {
    const box = $("jobs");
    $("job-count").textContent = `(${details.length})`;
    $("no-jobs").hidden = details.length > 0;
    const cards = details.map(jobCard);
    box.replaceChildren(...cards);
  }

  function jobCard({ job, status, frontier }) {
    const card = el("section", { class: "job", "data-job": job.id });
    const title = el("h3");
    title.append(el("span", { class: "job-name" }, job.name || "(unnamed)"), " ");
    title.append(el("span", { class: "mono muted" }, job.id), " ");
    title.append(el("span", { class: "state state-" + status.state }, status.state), " ");
    const life = status.lifecycle ? status.lifecycle.state : "active";
    title.append(el("span", { class: "lifecycle lifecycle-" + life, title: status.lifecycle ? status.lifecycle.reason : "" }, life));
    card.append(title);
    if (status.profile_mismatch) {
      card.append(el("p", { class: "error profile-mismatch" }, "profile mismatch: " + status.profile_mismatch.reason));
    }
    const shape = `${job.stages} stages × ${job.microbatches} microbatches (${job.schedule.name}), ` +
      `${job.data_parallel} pipeline(s) × tensor-parallel ${job.tensor_parallel} = ` +
      `${job.world_size} GPUs · ranks ${status.registered_ranks} registered, ` +
      `${status.connected_ranks} connected`;
    card.append(el("p", { class: "muted" }, shape));

    const facts = el("dl", { class: "facts" });
    const plan = status.plan;
    const m = status.measured;
    const add = (label, node) => {
      facts.append(el("dt", {}, label));
      const dd = el("dd");
      dd.append(node);
      facts.append(dd);
    };
    add("plan", el("span", { class: "plan-kind" }, plan ? `v${plan.version} ${plan.kind}` : "none"));
    add("set by", el("span", { class: "constraint" }, plan && plan.constraint ? plan.constraint : "–"));
    add("plan power", value("span", "plan-power", plan ? plan.average_power : null,
      watts(plan ? plan.average_power : null)));
    add("measured power", value("span", "measured-power", m ? m.average_power : null,
      watts(m ? m.average_power : null)));
    add("energy saved", value("span", "energy-saved", m ? m.energy_saved : null,
      m && m.energy_saved === null ? "withheld (profile mismatch)"
        : m ? `${joules(m.energy_saved)} (${pct(m.max_clock_energy > 0 ? m.energy_saved / m.max_clock_energy : null)} of max clocks)` : "–"));
    add("iterations measured", el("span", { class: "iterations" }, m ? m.iterations : 0));
    const share = status.power_budget;
    add("budget share", value("span", "budget-share", share ? share.watts : null,
      share ? `${watts(share.watts)} of ${watts(share.budget)} (${share.policy})` +
        (share.feasible ? "" : ` — budget unreachable: ${share.on_infeasible}`)
        : life !== "active" ? `none (${life})` : "not covered"));
    card.append(facts);

    const row = el("div", { class: "row" });
    row.append(frontierSvg(job, frontier, plan));
    row.append(pipelineTable(status));
    card.append(row);
    if (plan && plan.power_timeline) card.append(timelineSvg(job, plan));

    if (status.recent_replans && status.recent_replans.length) {
      const ul = el("ul", { class: "replans" });
      for (const r of status.recent_replans.slice(-5).reverse()) {
        ul.append(el("li", {}, `${new Date(r.time * 1000).toLocaleTimeString()} v${r.version}: ${r.why}`));
      }
      card.append(el("h4", {}, "Recent replans"), ul);
    }
    return card;
  }

  function pipelineTable(status) {
    const table = el("table", { class: "pipelines" });
    const head = el("tr");
    for (const h of ["pipeline", "point", "time", "energy", "power", "straggler", "why"]) {
      head.append(el("th", {}, h));
    }
    const thead = el("thead");
    thead.append(head);
    table.append(thead);
    const body = el("tbody");
    const plans = status.plan && status.plan.pipelines ? status.plan.pipelines : [];
    for (const p of status.pipelines) {
      const pl = plans.find((x) => x.pipeline === p.pipeline) || {};
      const tr = el("tr", { "data-pipeline": p.pipeline });
      let straggler = "–";
      if (p.straggler) straggler = `${p.straggler.source}, ${num(p.straggler.time, 4)} s`;
      if (p.slow_stages) {
        const f = Object.entries(p.slow_stages.factors).map(([s, k]) => `stage ${s} ×${num(k, 2)}`);
        straggler += ` · slow ${f.join(", ")} (${p.slow_stages.status})`;
      }
      const slowLinks = p.slow_links || [];
      if (slowLinks.length) {
        const l = slowLinks.map(
          (x) => `link ${x.boundary} ${x.direction} ${num(x.time * 1000, 2)} ms` +
            (x.factor ? ` ×${num(x.factor, 2)}` : ""),
        );
        straggler += ` · slow ${l.join(", ")}`;
      }
      tr.append(
        el("td", {}, p.pipeline),
        el("td", { class: "point" }, pl.index !== undefined ? pl.index : "–"),
        el("td", {}, pl.time !== undefined ? num(pl.time, 4) + " s" : "–"),
        el("td", {}, pl.energy !== undefined ? joules(pl.energy) : "–"),
        el("td", {}, watts(pl.average_power)),
        el(
          "td",
          { class: p.straggler || slowLinks.length ? "straggler warn" : "straggler" },
          straggler,
        ),
        el("td", { class: "why" }, pl.reason || (status.plan ? status.plan.reason : "")),
      );
      body.append(tr);
    }
    table.append(body);
    return table;
  }

  // The frontier: energy per iteration (J) against iteration time (s), the deployed points
  // marked (each pipeline's that runs a point of the job's own frontier).
  function frontierSvg(job, frontier, plan) {
    const W = 360, H = 220, L = 62, R = 12, T = 12, B = 40;
    const g = svg("svg", {
      class: "frontier", width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img",
      "data-job": job.id,
    });
    g.append(svg("title", {}, `Frontier of job ${job.id}: energy against iteration time`));
    if (!frontier) {
      g.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "muted" },
        "no frontier yet"));
      return g;
    }
    const pts = frontier.points;
    const ts = pts.map((p) => p.time), es = pts.map((p) => p.energy);
    if (typeof frontier.t0 === "number") ts.push(frontier.t0);
    if (typeof frontier.e0 === "number") es.push(frontier.e0);
    const t0 = Math.min(...ts), t1 = Math.max(...ts), e0 = Math.min(...es), e1 = Math.max(...es);
    const x = (t) => L + (W - L - R) * (t1 > t0 ? (t - t0) / (t1 - t0) : 0.5);
    const y = (e) => H - B - (H - T - B) * (e1 > e0 ? (e - e0) / (e1 - e0) : 0.5);
    g.append(svg("rect", { x: L, y: T, width: W - L - R, height: H - T - B, class: "plot" }));
    g.append(svg("polyline", {
      class: "curve", points: pts.map((p) => `${x(p.time).toFixed(1)},${y(p.energy).toFixed(1)}`).join(" "),
    }));
    for (const [v, anchor, px] of [[t0, "start", L], [t1, "end", W - R]]) {
      g.append(svg("text", { x: px, y: H - B + 14, "text-anchor": anchor, class: "tick" }, num(v, 3)));
    }
    g.append(svg("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", class: "axis" },
      "iteration time (s)"));
    g.append(svg("text", { x: L - 4, y: T + 10, "text-anchor": "end", class: "tick" }, num(e1, 0)));
    g.append(svg("text", { x: L - 4, y: H - B, "text-anchor": "end", class: "tick" }, num(e0, 0)));
    g.append(svg("text", {
      x: 12, y: (T + H - B) / 2, "text-anchor": "middle", class: "axis",
      transform: `rotate(-90 12 ${(T + H - B) / 2})`,
    }, "energy (J)"));
    if (typeof frontier.t0 === "number" && typeof frontier.e0 === "number") {
      const c = svg("circle", { cx: x(frontier.t0), cy: y(frontier.e0), r: 3.5, class: "maxclock" });
      c.append(svg("title", {}, `max clocks: ${num(frontier.t0, 4)} s, ${joules(frontier.e0)}`));
      g.append(c);
    }
    const deployed = new Set();
    if (plan && plan.pipelines) {
      for (const p of plan.pipelines) if (p.frontier === "job" && p.index < pts.length) deployed.add(p.index);
    }
    for (const i of deployed) {
      const p = pts[i];
      const c = svg("circle", { cx: x(p.time), cy: y(p.energy), r: 5, class: "deployed", "data-index": i });
      c.append(svg("title", {}, `deployed point ${i}: ${num(p.time, 4)} s, ${joules(p.energy)}, ` +
        `${watts(p.average_power)}`));
      g.append(c);
    }
    return g;
  }

  // The deployed plan's power over two iterations (whole job): with its floors under swing
  // bounds (the plan alone in grey, the floors shaded), the bound drawn.
  function timelineSvg(job, plan) {
    const W = 740, H = 170, L = 62, R = 12, T = 22, B = 30;
    const tl = plan.power_timeline, before = tl.before || null, sw = plan.swing || null;
    const g = svg("svg", {
      class: "timeline", width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img",
      "data-job": job.id,
    });
    g.append(svg("title", {}, `Power of job ${job.id} over two iterations`));
    const period = tl.period_s, top = Math.max(tl.peak_w, before ? before.peak_w : 0) * 1.05;
    const x = (t) => L + (W - L - R) * (t / (2 * period));
    const y = (w) => H - B - (H - T - B) * (top > 0 ? w / top : 0);
    const steps = (samples) => {
      const pts = [];
      for (let it = 0; it < 2; it++) {
        for (let k = 0; k < samples.t.length; k++) {
          const t0 = samples.t[k] + it * period;
          const t1 = (k + 1 < samples.t.length ? samples.t[k + 1] : period) + it * period;
          pts.push(`${x(t0).toFixed(1)},${y(samples.w[k]).toFixed(1)}`,
            `${x(t1).toFixed(1)},${y(samples.w[k]).toFixed(1)}`);
        }
      }
      return pts.join(" ");
    };
    g.append(svg("rect", { x: L, y: T, width: W - L - R, height: H - T - B, class: "plot" }));
    if (before) g.append(svg("polyline", { class: "tl-before", points: steps(before.samples) }));
    g.append(svg("polyline", { class: before ? "tl-after" : "tl-plan", points: steps(tl.samples) }));
    if (sw && sw.bounds && typeof sw.bounds.max_swing === "number") {
      const lv = y((1 - sw.bounds.max_swing) * tl.peak_w);
      g.append(svg("line", { x1: L, x2: W - R, y1: lv, y2: lv, class: "tl-bound" }));
    }
    g.append(svg("text", { x: L - 4, y: T + 8, "text-anchor": "end", class: "tick" }, num(top, 0)));
    g.append(svg("text", { x: L - 4, y: H - B, "text-anchor": "end", class: "tick" }, "0"));
    g.append(svg("text", { x: W - R, y: H - B + 14, "text-anchor": "end", class: "tick" },
      `${num(2 * period, 3)} s`));
    g.append(svg("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", class: "axis" },
      "time, two iterations (s); job power (W)"));
    const change = tl.max_change_w ? tl.max_change_w["0.1"] : null;
    let caption = `swing ${num(tl.swing, 2)} · largest 100 ms change ${watts(change)}` +
      ` · peak ${watts(tl.peak_w)}, trough ${watts(tl.trough_w)}`;
    if (before) caption = `with floors: ${caption} (plan alone: swing ${num(before.swing, 2)})`;
    const unheld = sw && Array.isArray(sw.ranks_without_floor) ? sw.ranks_without_floor : [];
    if (unheld.length) {
      caption += ` · ${unheld.length} rank(s) cannot hold a floor (rank ` +
        `${unheld.map((r) => r.rank).join(", ")}: ${unheld[0].reason}); ` +
        `there the plan alone swings ${num(unheld[0].plan_swing, 2)}`;
    }
    g.append(svg("text", { x: L, y: 14, class: "tl-caption" }, caption));
    return g;
  }

  function start() {
    $("login").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const v = $("token").value.trim();
      if (!v) return;
      window.sessionStorage.setItem(TOKEN_KEY, v);
      $("token").value = "";
      $("login").hidden = true;
      refresh();
    });
    refresh();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

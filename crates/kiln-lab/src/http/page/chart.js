// kiln lab: the SVG charts (loss lines, per-module sensitivity bars), added to the `Lab`
// core after lab.js has run. Drawn with Lab.svg, so every label is a text node.
"use strict";
Object.assign(Lab, (() => {
  const { el, svg, num } = Lab;

  // The viewBox is the chart's width on screen, so its text stays 11 px at 360 px and at
  // 1280 px; a chart is drawn again when its width changes.
  let W = 600, H = 240;
  const PAD = { l: 54, r: 12, t: 12, b: 30 };
  const sx = (v, lo, hi) => PAD.l + (hi === lo ? 0.5 : (v - lo) / (hi - lo)) * (W - PAD.l - PAD.r);
  const sy = (v, lo, hi) => H - PAD.b - (hi === lo ? 0.5 : (v - lo) / (hi - lo)) * (H - PAD.t - PAD.b);
  const resized = new ResizeObserver((entries) => {
    for (const e of entries) if (e.target.redraw && Math.round(e.contentRect.width) !== e.target.drawnWidth) e.target.redraw();
  });
  function frame(node, label, redraw) {
    const w = Math.round(node.getBoundingClientRect().width);
    W = w >= 200 ? Math.min(w, 1200) : 600;
    H = W < 480 ? 200 : 240;
    if (!node.redraw) resized.observe(node);
    node.redraw = redraw;
    node.drawnWidth = w;
    node.setAttribute("viewBox", `0 0 ${W} ${H}`);
    node.setAttribute("role", "img");
    node.setAttribute("aria-label", label);
    node.replaceChildren();
  }
  // Grid lines and labels at `ticks` (values between lo and hi).
  function yAxis(node, lo, hi, ticks, fmt) {
    for (const v of ticks) {
      const y = sy(v, lo, hi);
      node.append(svg("line", { class: "grid", x1: PAD.l, x2: W - PAD.r, y1: y, y2: y }),
        svg("text", { x: PAD.l - 6, y: y + 4, "text-anchor": "end", text: fmt(v) }));
    }
    node.append(svg("line", { class: "axis", x1: PAD.l, x2: PAD.l, y1: PAD.t, y2: H - PAD.b }),
      svg("line", { class: "axis", x1: PAD.l, x2: W - PAD.r, y1: H - PAD.b, y2: H - PAD.b }));
  }
  // Lines: series = [{name, key, points:[[x, y]]}]; data-points = all points drawn.
  function lineChart(node, series, opts = {}) {
    const all = series.flatMap((s) => s.points);
    frame(node, opts.label || "line chart", () => lineChart(node, series, opts));
    node.dataset.points = String(all.length);
    if (!all.length) {
      node.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", text: opts.empty || "waiting for data…" }));
      return;
    }
    const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs, opts.xMax || -Infinity); // room for the points to come
    let y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
    const pad = (y1 - y0) * 0.08; y0 -= pad; y1 += pad;
    yAxis(node, y0, y1, [0, 1, 2, 3, 4].map((i) => y0 + (y1 - y0) * i / 4), (v) => num(v, 3));
    node.append(svg("text", { x: PAD.l, y: H - 8, text: `${opts.xLabel || "x"} ${x0}` }),
      svg("text", { x: W - PAD.r, y: H - 8, "text-anchor": "end", text: String(x1) }));
    for (const s of series) {
      if (!s.points.length) continue;
      const pts = s.points.map(([x, y]) => `${sx(x, x0, x1).toFixed(1)},${sy(y, y0, y1).toFixed(1)}`);
      node.append(svg("polyline", { class: "s-" + s.key, points: pts.join(" ") }));
      for (const [x, y] of s.points) {
        node.append(svg("circle", { class: "p-" + s.key, cx: sx(x, x0, x1).toFixed(1), cy: sy(y, y0, y1).toFixed(1), r: 2.5 },
          svg("title", { text: `${s.name} ${opts.xLabel || "x"} ${x}: ${num(y)}` })));
      }
    }
  }
  // Grouped bars on a log scale: groups = [{label, values:[v per key]}], slots = how many
  // groups the x axis has room for (so bars fill in left to right); data-bars = groups drawn.
  function barChart(node, groups, opts = {}) {
    frame(node, opts.label || "bar chart", () => barChart(node, groups, opts));
    node.dataset.bars = String(groups.length);
    const vals = groups.flatMap((g) => g.values).filter((v) => Number.isFinite(v) && v > 0);
    if (!vals.length) {
      node.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", text: opts.empty || "waiting for data…" }));
      return;
    }
    let lo = Math.floor(Math.log10(Math.min(...vals))), hi = Math.ceil(Math.log10(Math.max(...vals)));
    if (lo === hi) hi = lo + 1;
    // Whole decades only: 1e-5, 1e-4, …, at most six of them.
    const step = Math.ceil((hi - lo) / 6), decades = [];
    for (let d = lo; d <= hi; d += step) decades.push(d);
    yAxis(node, lo, hi, decades, (v) => "1e" + v);
    const slots = Math.max(opts.slots || 0, groups.length, 1), keys = opts.keys || [];
    const slotW = (W - PAD.l - PAD.r) / slots, barW = Math.max(slotW * 0.85 / Math.max(keys.length, 1), 0.6);
    groups.forEach((g, i) => {
      g.values.forEach((v, k) => {
        if (!Number.isFinite(v) || v <= 0) return;
        const top = sy(Math.max(Math.log10(v), lo), lo, hi);
        node.append(svg("rect", { class: "b-" + k, x: (PAD.l + i * slotW + k * barW).toFixed(2), y: top.toFixed(1),
          width: barW.toFixed(2), height: (H - PAD.b - top).toFixed(1) },
        svg("title", { text: `${g.label} · ${keys[k] || ""}: ${num(v)}` })));
      });
    });
    node.append(svg("text", { x: PAD.l, y: H - 8, text: opts.xLabel || "" }));
  }
  function legend(items) {
    return el("ul", { class: "legend" }, items.map(([k, label]) => el("li", { class: "k-" + k, text: label })));
  }

  return { lineChart, barChart, legend };
})());

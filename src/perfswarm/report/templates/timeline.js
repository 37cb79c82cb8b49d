// The report's timeline: nested spans per lane on a canvas, iteration bands, zoom and pan.
// Names reach the page only through canvas fillText and textContent: never parsed as HTML.
// Keys (when the timeline has focus): w/s or +/- zoom, a/d or arrows pan, n/p next/previous
// iteration, 0 or Home shows everything. Wheel zooms at the pointer, drag pans,
// double-click zooms to a span.
"use strict";
function perfswarmTimeline(root, tl) {
  var ROW = 16, GAP = 6, LABEL = 220, AXIS = 30;
  var sp = tl.spans, n = sp.start.length;
  var canvas = root.querySelector("canvas"), tip = root.querySelector(".tl-tip");
  var info = document.querySelector(".tl-info");
  var ctx = canvas.getContext("2d");
  // Lane tops in rows, and per (lane, depth) row the spans in start order.
  var laneTop = [], rows = 0;
  tl.lanes.forEach(function (l) { laneTop.push(rows); rows += l.rows; });
  var rowSpans = [];
  for (var r = 0; r < rows; r++) rowSpans.push([]);
  for (var i = 0; i < n; i++) rowSpans[laneTop[sp.lane[i]] + sp.depth[i]].push(i);
  var rowMaxDur = rowSpans.map(function (list) {
    return list.reduce(function (m, i) { return Math.max(m, sp.dur[i]); }, 0);
  });
  var laneY = function (lane) { return AXIS + laneTop[lane] * ROW + lane * GAP; };
  var height = AXIS + rows * ROW + tl.lanes.length * GAP + 4;
  // The whole run is 0 to end; the first view is where the spans are.
  var end = Math.max(tl.end_ns, 1), hovered = -1, lo = end, hi = 0;
  for (var j = 0; j < n; j++) { lo = Math.min(lo, sp.start[j]); hi = Math.max(hi, sp.start[j] + sp.dur[j]); }
  var view = n ? {t0: lo, t1: hi} : {t0: 0, t1: end};
  var steps = tl.steps.slice().sort(function (a, b) { return a.start - b.start; });
  var colors = {};
  function color(i) {
    var key = sp.kind[i] * 1e6 + sp.name[i];
    if (colors[key] === undefined) {
      var name = tl.names[sp.name[i]], h = 0;
      for (var c = 0; c < name.length; c++) h = (h * 31 + name.charCodeAt(c)) >>> 0;
      var device = tl.lanes[sp.lane[i]].device;
      colors[key] = "hsl(" + (h % 360) + "," + (device ? 70 : 45) + "%," + (device ? 55 : 68) + "%)";
    }
    return colors[key];
  }
  function width() { return Math.max(300, root.clientWidth); }
  function x(t, w) { return LABEL + (t - view.t0) / (view.t1 - view.t0) * (w - LABEL); }
  function fmt(ns) {
    var a = Math.abs(ns);
    if (a >= 1e9) return (ns / 1e9).toFixed(3) + " s";
    if (a >= 1e6) return (ns / 1e6).toFixed(3) + " ms";
    if (a >= 1e3) return (ns / 1e3).toFixed(3) + " us";
    return ns + " ns";
  }
  function first(list, t) {  // first index in `list` whose span may end after t
    var lo = 0, hi = list.length;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (sp.start[list[mid]] < t) lo = mid + 1; else hi = mid; }
    return lo;
  }
  function draw() {
    var w = width(), dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(height * dpr)) {
      canvas.width = Math.round(w * dpr); canvas.height = Math.round(height * dpr);
      canvas.style.width = w + "px"; canvas.style.height = height + "px";
    }
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, height);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    // Iteration bands, labels only where they fit.
    var lastLabel = -1e9;
    steps.forEach(function (s, k) {
      var x0 = Math.max(LABEL, x(s.start, w)), x1 = Math.min(w, x(s.end, w));
      if (x1 <= LABEL || x0 >= w) return;
      ctx.fillStyle = k % 2 ? "rgba(80,120,200,0.10)" : "rgba(80,120,200,0.04)";
      ctx.fillRect(x0, AXIS, x1 - x0, height - AXIS);
      var label = "step " + s.step, lw = ctx.measureText(label).width + 8;
      if (x0 >= lastLabel && x1 - x0 >= lw) {
        ctx.fillStyle = "#335";
        ctx.fillText(label, x0 + 3, AXIS - 8);
        lastLabel = x0 + lw;
      }
    });
    // Time axis: about 8 ticks at round numbers.
    var span = view.t1 - view.t0, stepNs = Math.pow(10, Math.floor(Math.log10(span / 8)));
    if (span / stepNs > 16) stepNs *= 2;
    if (span / stepNs > 16) stepNs *= 2.5;
    ctx.fillStyle = "#556"; ctx.strokeStyle = "#ccd";
    for (var t = Math.ceil(view.t0 / stepNs) * stepNs; t <= view.t1; t += stepNs) {
      var tx = x(t, w);
      ctx.beginPath(); ctx.moveTo(tx, 0); ctx.lineTo(tx, height); ctx.stroke();
      ctx.fillText(fmt(t), tx + 2, 7);
    }
    // Spans: per row, the visible ones; sub-pixel spans share one pixel column per row.
    var drawnCount = 0;
    for (var row = 0; row < rows; row++) {
      var list = rowSpans[row];
      if (!list.length) continue;
      var lane = 0;
      while (lane + 1 < tl.lanes.length && laneTop[lane + 1] <= row) lane++;
      var y = laneY(lane) + (row - laneTop[lane]) * ROW;
      var k = first(list, view.t0 - rowMaxDur[row]), lastPx = -1;
      for (; k < list.length; k++) {
        var i = list[k];
        if (sp.start[i] > view.t1) break;
        if (sp.start[i] + sp.dur[i] < view.t0) continue;
        var x0 = Math.max(LABEL, x(sp.start[i], w)), x1 = Math.min(w, x(sp.start[i] + sp.dur[i], w));
        if (x1 - x0 < 1) { if (Math.floor(x0) === lastPx) continue; x1 = x0 + 1; }
        lastPx = Math.floor(x1 - 1);
        ctx.fillStyle = i === hovered ? "#222" : color(i);
        ctx.fillRect(x0, y + 1, x1 - x0, ROW - 2);
        drawnCount++;
        if (x1 - x0 > 30) {
          ctx.save(); ctx.beginPath(); ctx.rect(x0, y, x1 - x0 - 2, ROW); ctx.clip();
          ctx.fillStyle = i === hovered ? "#fff" : "#111";
          ctx.fillText(tl.names[sp.name[i]], x0 + 3, y + ROW / 2);
          ctx.restore();
        }
      }
    }
    // Lane labels over a white gutter.
    ctx.fillStyle = "#fff"; ctx.fillRect(0, AXIS, LABEL - 2, height);
    tl.lanes.forEach(function (l, j) {
      var y0 = laneY(j);
      ctx.fillStyle = l.device ? "#7a3" : "#37a"; ctx.fillRect(0, y0, 3, l.rows * ROW);
      ctx.fillStyle = "#222";
      ctx.save(); ctx.beginPath(); ctx.rect(0, y0, LABEL - 6, ROW); ctx.clip();
      ctx.fillText(l.label, 6, y0 + ROW / 2); ctx.restore();
      ctx.strokeStyle = "#dde"; ctx.beginPath(); ctx.moveTo(0, y0 - GAP / 2); ctx.lineTo(w, y0 - GAP / 2); ctx.stroke();
    });
    root.dataset.drawn = drawnCount;
    info.textContent = fmt(view.t0) + " – " + fmt(view.t1) + " (" + fmt(view.t1 - view.t0) + " shown)";
  }
  var pending = false;
  function redraw() { if (!pending) { pending = true; requestAnimationFrame(function () { pending = false; draw(); }); } }
  function setView(t0, t1) {
    var minSpan = 1000;
    if (t1 - t0 < minSpan) { var mid = (t0 + t1) / 2; t0 = mid - minSpan / 2; t1 = mid + minSpan / 2; }
    var len = Math.min(t1 - t0, end);
    t0 = Math.max(0, Math.min(t0, end - len));
    view.t0 = t0; view.t1 = t0 + len; current = -1;
    root.dataset.view = Math.round(view.t0) + "," + Math.round(view.t1);
    redraw();
  }
  function zoom(factor, at) {
    var t = at === undefined ? (view.t0 + view.t1) / 2 : at;
    setView(t - (t - view.t0) * factor, t + (view.t1 - t) * factor);
  }
  function pan(fraction) { var d = (view.t1 - view.t0) * fraction; setView(view.t0 + d, view.t1 + d); }
  // n/p walk the iterations; after a zoom or pan, n starts at the first one from the
  // view's left edge and p at the last one before its right edge.
  var current = -1;
  function jumpStep(dir) {
    if (!steps.length) return;
    var k = current;
    if (k < 0) {
      k = dir > 0 ? 0 : steps.length - 1;
      while (dir > 0 && k < steps.length - 1 && steps[k].start < view.t0) k++;
      while (dir < 0 && k > 0 && steps[k].end > view.t1) k--;
    } else k = Math.max(0, Math.min(steps.length - 1, k + dir));
    var s = steps[k], pad = (s.end - s.start) * 0.05;
    setView(s.start - pad, s.end + pad);
    current = k;
  }
  function timeAt(px) { return view.t0 + (px - LABEL) / (width() - LABEL) * (view.t1 - view.t0); }
  function spanAt(px, py) {
    if (px < LABEL || py < AXIS) return -1;
    for (var lane = 0; lane < tl.lanes.length; lane++) {
      var y0 = laneY(lane), r = Math.floor((py - y0) / ROW);
      if (r < 0 || r >= tl.lanes[lane].rows) continue;
      var row = laneTop[lane] + r, list = rowSpans[row], t = timeAt(px);
      var slack = (view.t1 - view.t0) / (width() - LABEL);  // one pixel
      for (var k = first(list, t - rowMaxDur[row] - slack); k < list.length && sp.start[list[k]] <= t + slack; k++) {
        var i = list[k];
        if (sp.start[i] + sp.dur[i] >= t - slack) return i;
      }
    }
    return -1;
  }
  function show(i, ev) {
    if (i < 0) { tip.hidden = true; return; }
    tip.hidden = false;
    tip.textContent = tl.names[sp.name[i]] + "\n" + tl.kinds[sp.kind[i]] + " · " + fmt(sp.dur[i]) +
      " at " + fmt(sp.start[i]) + " · " + tl.lanes[sp.lane[i]].label + " depth " + sp.depth[i];
    var box = root.getBoundingClientRect();
    tip.style.left = Math.min(ev.clientX - box.left + 12, box.width - 320) + "px";
    tip.style.top = (ev.clientY - box.top + 14) + "px";
  }
  var drag = null;
  canvas.addEventListener("mousedown", function (ev) { drag = {x: ev.clientX, t0: view.t0, t1: view.t1}; root.focus(); });
  window.addEventListener("mouseup", function () { drag = null; });
  canvas.addEventListener("mousemove", function (ev) {
    var box = canvas.getBoundingClientRect();
    if (drag) {
      var dt = (ev.clientX - drag.x) / (width() - LABEL) * (drag.t1 - drag.t0);
      setView(drag.t0 - dt, drag.t1 - dt); return;
    }
    var i = spanAt(ev.clientX - box.left, ev.clientY - box.top);
    if (i !== hovered) { hovered = i; redraw(); }
    show(i, ev);
  });
  canvas.addEventListener("mouseleave", function () { hovered = -1; tip.hidden = true; redraw(); });
  canvas.addEventListener("wheel", function (ev) {
    ev.preventDefault();
    var box = canvas.getBoundingClientRect(), px = ev.clientX - box.left;
    if (Math.abs(ev.deltaX) > Math.abs(ev.deltaY)) pan(ev.deltaX / (width() - LABEL));
    else zoom(Math.pow(1.0015, ev.deltaY), px > LABEL ? timeAt(px) : undefined);
  }, {passive: false});
  canvas.addEventListener("dblclick", function (ev) {
    var box = canvas.getBoundingClientRect(), i = spanAt(ev.clientX - box.left, ev.clientY - box.top);
    if (i >= 0) { var pad = sp.dur[i] * 0.1; setView(sp.start[i] - pad, sp.start[i] + sp.dur[i] + pad); }
  });
  root.addEventListener("keydown", function (ev) {
    var handled = true;
    switch (ev.key) {
      case "w": case "W": case "+": case "=": zoom(0.5); break;
      case "s": case "S": case "-": zoom(2); break;
      case "a": case "A": case "ArrowLeft": pan(-0.25); break;
      case "d": case "D": case "ArrowRight": pan(0.25); break;
      case "n": case "N": case "]": jumpStep(1); break;
      case "p": case "P": case "[": jumpStep(-1); break;
      case "0": case "Home": setView(0, end); break;
      default: handled = false;
    }
    if (handled) ev.preventDefault();
  });
  window.addEventListener("resize", redraw);
  setView(view.t0 - (view.t1 - view.t0) * 0.01, view.t1 + (view.t1 - view.t0) * 0.01);
  return {draw: draw, setView: setView};
}

/* pagedkv-sql report: search by seq_id / request id, the per-sequence strips, the charts.
   Everything it needs is in this page (#pagedkv-data); it makes no request. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("pagedkv-data").textContent);
  var PAGE = 100, STRIP_W = 640, STRIP_H = 14;
  var seqs = data.sequences;  // [seq_id, block_tables, tokens, strip, request_ids]
  var shown = seqs, page = 0;
  var input = document.getElementById("search");
  var status = document.getElementById("search-status");
  var tip = document.getElementById("strip-tip");
  var onlyBad = document.getElementById("only-bad");

  function counts(strip) {
    var c = {};
    for (var i = 0; i < strip.length; i++) c[strip[i]] = (c[strip[i]] || 0) + 1;
    return c;
  }

  function drawStrip(canvas, strip) {
    var n = Math.max(strip.length, 1);
    var per = Math.max(1, Math.ceil(n / STRIP_W));       // blocks a pixel column
    var cols = Math.ceil(n / per);
    var w = Math.max(1, Math.min(18, Math.floor(STRIP_W / cols)));
    canvas.width = cols * w; canvas.height = STRIP_H;
    var ctx = canvas.getContext("2d");
    for (var c = 0; c < cols; c++) {
      var best = ".", rank = -1;
      for (var i = c * per; i < Math.min(n, (c + 1) * per); i++) {
        var r = data.strip_rank[strip[i]];
        if (r > rank) { rank = r; best = strip[i]; }
      }
      ctx.fillStyle = data.strip_colours[best];
      ctx.fillRect(c * w, 0, w > 2 ? w - 1 : w, STRIP_H);
    }
    canvas.dataset.per = per; canvas.dataset.w = w;
  }

  function cell(text, cls) {
    var td = document.createElement("td");
    if (cls) td.className = cls;
    td.textContent = text;
    return td;
  }

  function renderSeqs() {
    var body = document.querySelector("#seq-table tbody");
    body.textContent = "";
    var start = page * PAGE, end = Math.min(shown.length, start + PAGE);
    for (var i = start; i < end; i++) {
      var s = shown[i], tr = document.createElement("tr"), c = counts(s[3]);
      tr.appendChild(cell(String(s[0]), "num"));
      if (data.has_requests) tr.appendChild(cell(s[4] || "-"));
      tr.appendChild(cell(s[1], "num"));
      tr.appendChild(cell(s[2].toLocaleString("en-US"), "num"));
      tr.appendChild(cell(String((c.r || 0) + (c.s || 0) + (c.x || 0)), "num"));
      tr.appendChild(cell(String(c.c || 0), "num"));
      tr.appendChild(cell(String(c.m || 0), "num"));
      var td = cell("", "strip"), canvas = document.createElement("canvas");
      canvas.dataset.seq = i;
      drawStrip(canvas, s[3]);
      td.appendChild(canvas); tr.appendChild(td);
      body.appendChild(tr);
    }
    document.getElementById("seq-page").textContent = shown.length
      ? (start + 1) + "-" + end + " of " + shown.length.toLocaleString("en-US") + " sequences"
      : "no sequence matches";
    document.getElementById("seq-prev").disabled = page === 0;
    document.getElementById("seq-next").disabled = end >= shown.length;
  }

  function tokensOf(text) {
    return text.split(/[\s,:;\[\]()]+/).filter(function (t) { return t.length; });
  }

  function search() {
    var q = input.value.trim();
    var bad = onlyBad.checked;
    page = 0;
    shown = seqs.filter(function (s) {
      if (bad && s[3].indexOf("m") < 0 && s[3].indexOf("x") < 0) return false;
      return !q || String(s[0]) === q || (s[4] && s[4].indexOf(q) >= 0);
    });
    renderSeqs();
    highlight(q ? shown.map(function (s) { return String(s[0]); }) : []);
    // findings: the rows naming the sequence, its request id or its block tables
    var terms = {};
    if (q) {
      terms[q] = true;
      shown.forEach(function (s) {
        terms[String(s[0])] = true;
        tokensOf(s[1]).forEach(function (t) { terms[t] = true; });
      });
    }
    var hits = 0;
    document.querySelectorAll("table.rows").forEach(function (table) {
      var found = 0;
      table.querySelectorAll("tbody tr").forEach(function (tr) {
        var hit = false;
        if (q) {
          var words = tokensOf(tr.dataset.key || "");
          for (var i = 0; i < words.length && !hit; i++) hit = terms[words[i]] === true;
        }
        tr.classList.toggle("hit", hit);
        tr.style.display = !q || hit ? "" : "none";
        if (hit) found++;
      });
      hits += found;
      var d = table.closest("details");
      if (q && found) d.open = true;
    });
    status.textContent = q
      ? shown.length + " sequence(s), " + hits + " finding row(s)"
      : "";
  }

  input.addEventListener("input", search);
  onlyBad.addEventListener("change", search);
  document.getElementById("seq-prev").addEventListener("click", function () {
    page = Math.max(0, page - 1); renderSeqs();
  });
  document.getElementById("seq-next").addEventListener("click", function () {
    page += 1; renderSeqs();
  });
  document.addEventListener("click", function (e) {
    var a = e.target.closest && e.target.closest("a.seq");
    if (!a) return;
    e.preventDefault();
    input.value = a.dataset.seq;
    search();
    document.getElementById("sequences").scrollIntoView();
  });
  document.querySelector("#seq-table tbody").addEventListener("mousemove", function (e) {
    var canvas = e.target;
    if (canvas.tagName !== "CANVAS") { tip.style.display = "none"; return; }
    var s = shown[Number(canvas.dataset.seq)];
    var x = e.offsetX, per = Number(canvas.dataset.per), w = Number(canvas.dataset.w);
    var first = Math.floor(x / w) * per, last = Math.min(s[3].length, first + per) - 1;
    if (first > last) { tip.style.display = "none"; return; }
    var label = per === 1 ? "block " + first : "blocks " + first + "-" + last;
    tip.textContent = "seq " + s[0] + ", " + label + ": " + data.strip_names[s[3][first]];
    tip.style.left = (e.clientX + 12) + "px"; tip.style.top = (e.clientY + 12) + "px";
    tip.style.display = "block";
  });
  document.querySelector("#seq-table tbody").addEventListener("mouseleave", function () {
    tip.style.display = "none";
  });

  var config = { displaylogo: false, responsive: true,
                 modeBarButtonsToRemove: ["lasso2d", "select2d"] };
  Object.keys(data.figures).forEach(function (id) {
    var fig = data.figures[id];
    Plotly.newPlot(id, fig.data, fig.layout, config);
  });
  renderSeqs();

  // -- the memory map: one heatmap a tier, from the raster the page carries deflated ------
  var TYPES = { u2: Uint16Array, u4: Uint32Array };
  var UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

  function inflate(b64) {
    var bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer();
  }

  function humanBytes(n) {  // as the map's titles say them: 256 MiB, 1.5 KiB
    var v = Number(n), u = 0;
    while (Math.abs(v) >= 1000 && u < UNITS.length - 1) { v /= 1024; u++; }
    return u === 0 ? n + " B" : Number(v.toPrecision(3)) + " " + UNITS[u];
  }

  function hex(big) { return (big < 0n ? "-0x" + (-big).toString(16) : "0x" + big.toString(16)); }

  function lastAtMost(sorted, v) {  // the index of the last value <= v in a sorted array
    var lo = 0, hi = sorted.length - 1, found = -1;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1;
      if (sorted[mid] <= v) { found = mid; lo = mid + 1; } else { hi = mid - 1; }
    }
    return found;
  }

  function cellAddress(t, cell) {  // exact: 64-bit addresses as BigInt
    var k = lastAtMost(t.segment_cells, cell);
    return BigInt(t.segment_addresses[k]) + BigInt(cell - t.segment_cells[k]) * 256n;
  }

  function stateName(m, state, owner) {
    if (state >= m.owned) return "owned by one sequence";
    return m.states[String(state)] || "";
  }

  function describe(m, t, row, col) {
    var p = row * t.width + col, first = p * t.per_pixel;
    if (first >= t.cells) return null;
    var last = Math.min(t.cells, first + t.per_pixel) - 1;
    var state = t.z[p], owner = t.owner[p];
    var name = t.tier.toUpperCase() + " ";
    var lines = [];
    if (state === m.gap_state && t.per_pixel === 1) {
      var g = t.gap_blocks[lastAtMost(t.gap_cells, first)];
      var at = cellAddress(t, first);
      lines.push(name + hex(at) + " - " + hex(at + BigInt(g) * 256n - 1n));
      lines.push("unmapped: " + g.toLocaleString("en-US") + " free blocks (" +
                 humanBytes(g * 256) + ") collapsed");
      return { text: lines.join("\n"), seq: null };
    }
    var end = cellAddress(t, last) + 255n;
    if (t.per_pixel === 1) lines.push(name + "block " + hex(cellAddress(t, first)));
    else lines.push(name + hex(cellAddress(t, first)) + " - " + hex(end) + " (" +
                    (last - first + 1) + " cells, the most severe shown)");
    lines.push(stateName(m, state, owner));
    var seq = owner ? m.owners[owner - 1] : null;
    if (seq !== null) {
      lines.push((state >= m.owned ? "seq " : "first holder: seq ") + seq + " (click to show it)");
    }
    return { text: lines.join("\n"), seq: seq };
  }

  // the blocks the searched sequences own, ringed on the map (at most MAX_MARKS pixels)
  var MAX_MARKS = 5000, drawnTiers = [];
  function highlight(seqIds) {
    var m = data.map, wanted = {};
    seqIds.forEach(function (id) {
      var k = lastAtMost(m.ownerKeys, id);  // the owners as sorted strings
      if (k >= 0 && m.ownerKeys[k] === id) wanted[m.ownerIndex[k]] = true;
    });
    drawnTiers.forEach(function (t) {
      var xs = [], ys = [];
      if (Object.keys(wanted).length) {
        for (var p = 0; p < t.owner.length && xs.length < MAX_MARKS; p++) {
          if (wanted[t.owner[p]]) { xs.push(p % t.width); ys.push(Math.floor(p / t.width)); }
        }
      }
      Plotly.restyle(t.div, { x: [xs], y: [ys] }, [t.marks]);
    });
  }

  function drawMap(m) {
    var status = document.getElementById("map-status");
    var section = document.getElementById("map");
    m.gap_state = Number(Object.keys(m.states).filter(function (k) {
      return m.states[k].indexOf("unmapped") === 0;
    })[0]);
    if (typeof DecompressionStream === "undefined") {
      status.textContent = "This browser cannot unpack the map (it needs DecompressionStream: " +
        "Chrome 80, Firefox 113, Safari 16.4 or later); `pagedkv-sql map` draws it as a PNG.";
      section.dataset.drawn = "no";
      return;
    }
    // owner index (1-based, as the raster has it) by seq_id, for the search's highlight
    var order = m.owners.map(function (id, i) { return [id, i + 1]; });
    order.sort(function (a, b) { return a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0; });
    m.ownerKeys = order.map(function (o) { return o[0]; });
    m.ownerIndex = order.map(function (o) { return o[1]; });
    var jobs = m.tiers.map(function (t) {
      var div = document.getElementById("map-" + t.tier);
      if (t.empty) return Plotly.newPlot(div, t.figure.data, t.figure.layout, config);
      return Promise.all([inflate(t.z), inflate(t.owner)]).then(function (arrays) {
        t.z = new Uint16Array(arrays[0]);
        t.owner = new TYPES[t.owner_type](arrays[1]);
        var z = [];
        for (var r = 0; r < t.rows; r++) z.push(t.z.subarray(r * t.width, (r + 1) * t.width));
        var trace = t.figure.data[0];
        trace.z = z;
        t.figure.data.push({
          type: "scatter", mode: "markers", x: [], y: [], name: "searched", hoverinfo: "skip",
          marker: { symbol: "square-open", size: 9, color: "#ff00aa", line: { width: 2 } }
        });
        t.marks = t.figure.data.length - 1;
        t.div = div;
        return Plotly.newPlot(div, t.figure.data, t.figure.layout, config).then(function () {
          drawnTiers.push(t);
          div.on("plotly_hover", function (e) {
            var pt = e.points[0];
            if (!pt || pt.curveNumber !== 0) return;
            var d = describe(m, t, Math.round(pt.y), Math.round(pt.x));
            if (!d) { tip.style.display = "none"; return; }
            tip.textContent = d.text;
            var ev = e.event;
            tip.style.left = (ev.clientX + 14) + "px"; tip.style.top = (ev.clientY + 14) + "px";
            tip.style.display = "block";
          });
          div.on("plotly_unhover", function () { tip.style.display = "none"; });
          div.on("plotly_click", function (e) {
            var pt = e.points[0];
            var d = pt && pt.curveNumber === 0 && describe(m, t, Math.round(pt.y), Math.round(pt.x));
            if (!d || d.seq === null) return;
            tip.style.display = "none";
            input.value = d.seq;
            search();
            document.getElementById("sequences").scrollIntoView();
          });
        });
      });
    });
    Promise.all(jobs).then(function () { section.dataset.drawn = "yes"; }, function (err) {
      status.textContent = "The map could not be drawn: " + err;
      section.dataset.drawn = "no";
      throw err;
    });
  }

  drawMap(data.map);
})();

/* mha-trace's interactive page: the head view, the model view, a token's walk (also tile by
   tile), the trace, the patching grids, a patched path and Whisper's alignment.
   Plain JavaScript, no library, no network. The data comes from the #mha-data JSON block; every
   text from it is written with textContent, never parsed as HTML. */
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("mha-data").textContent);
  const root = document.getElementById("mha");
  const SVG = "http://www.w3.org/2000/svg";
  const COLORS = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6",
                  "#9a6324", "#808000", "#469990", "#000075", "#e6beff"];
  const color = (h) => COLORS[h % COLORS.length];

  function el(tag, props, ...kids) {
    const node = document.createElement(tag);
    Object.entries(props || {}).forEach(([k, v]) => {
      if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v);
    });
    kids.forEach((kid) => node.append(kid));
    return node;
  }
  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    Object.entries(attrs || {}).forEach(([k, v]) => node.setAttribute(k, v));
    return node;
  }
  const fmt = (x, d) => x === null ? "—" : Number(x).toFixed(d === undefined ? 4 : d);  // null: undefined, said in words

  /* ---- page frame and theme ---- */
  const dark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
  document.documentElement.dataset.theme = dark ? "dark" : "light";
  const toggle = el("button", {id: "theme", text: "light / dark (t)", onclick: () => {
    const t = document.documentElement.dataset.theme;
    document.documentElement.dataset.theme = t === "dark" ? "light" : "dark";
  }});
  root.append(el("header", {}, el("h1", {text: data.title}), toggle));
  document.addEventListener("keydown", (e) => {
    if (e.key === "t" && !e.target.closest("select")) toggle.click();
  });

  /* ---- heads: the head view and the model view ---- */
  function headsView() {
    const T = data.tokens.length, H = data.heads, layers = data.layer_numbers;
    const decode = (b64) => {
      const raw = atob(b64), bytes = new Uint8Array(raw.length);
      for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
      return new Uint16Array(bytes.buffer);
    };
    const shown = {weight: decode(data.weights), effect: data.effect ? decode(data.effect) : null};
    let w16 = shown.weight;  // the effect weights instead, toggled with "e"
    const weight = (l, h, q, k) => w16[((l * H + h) * T + q) * T + k] / 10000;
    const group = H / data.kv_heads;
    const picked = data.picked && data.picked.length === 1 ? data.picked[0][1] - 1 : null;
    const many = T > 48;  // a long sentence: one token's lines at a time (all of them: thousands)
    const state = {layer: 0, heads: new Set(picked === null ? [...Array(H).keys()] : [picked]),
                   focus: many ? {side: "q", index: 0} : null, pinned: many};

    const controls = el("div", {class: "controls"});
    if (layers.length > 1) {
      const select = el("select", {id: "layer", "aria-label": "layer"});
      layers.forEach((n, i) => select.append(el("option", {value: i, text: `layer ${n}`})));
      select.addEventListener("change", () => { state.layer = +select.value; draw(); });
      controls.append(el("label", {}, "Layer ", select));
    }
    const headButtons = [...Array(H).keys()].map((h) => {
      const b = el("button", {class: "head", "data-head": h + 1, "aria-pressed": "true",
                              title: group > 1 ? `K/V head ${Math.floor(h / group) + 1}` : ""},
                   el("span", {class: "swatch", style: `background:${color(h)}`}), `head ${h + 1}`);
      b.addEventListener("click", () => {
        state.heads.has(h) ? state.heads.delete(h) : state.heads.add(h);
        draw();
      });
      return b;
    });
    controls.append(...headButtons,
      el("button", {id: "all", text: "all", onclick: () => { state.heads = new Set([...Array(H).keys()]); draw(); }}),
      el("button", {id: "none", text: "none", onclick: () => { state.heads.clear(); draw(); }}));
    let paintTiles = () => {};
    const effectButton = shown.effect && el("button", {id: "effect", "aria-pressed": "false",
      title: "effect: each weight × the length of what its key's value moves through W_O, renormalised (Kobayashi et al. 2020)",
      text: "weight / effect (e)", onclick: () => {
        w16 = w16 === shown.effect ? shown.weight : shown.effect;
        effectButton.setAttribute("aria-pressed", w16 === shown.effect);
        draw(); paintTiles();
      }});
    if (effectButton) controls.append(effectButton);
    const readout = el("div", {class: "readout", id: "readout", "aria-live": "polite"});
    const room = Math.max(150, 10 + 9 * Math.max(...data.tokens.map((t) => t.length)));  // the longest label
    const rowH = 26, left = room, right = room + 260, width = right + room;
    const picture = svg("svg", {id: "head-view", width, height: T * rowH + 30, role: "img",
                                "aria-label": "attention from each token (left) to each token (right)"});
    root.append(el("h2", {text: "Head view"}), controls,
                el("p", {class: "hint", text: "Hover or click a token: on the left, what it attends " +
                  "to; on the right, what attends to it. Keys: ↑ ↓ move, ← → layer, 1-9 a head, " +
                  "Esc clears." + (shown.effect ? " e: the effect weights (weight × ‖v·W_O‖, renormalised) or the weights." : "") +
                  (many ? ` With ${T} tokens, one token's lines show at a time.` : "")}),
                picture, readout);

    function focus(side, index, pin) {
      if (state.pinned && !pin) return;  // a clicked token stays until another is clicked
      if (many && index === null) return;
      state.focus = index === null ? null : {side, index};
      state.pinned = !!pin && index !== null;
      draw();
    }
    const y = (i) => 20 + i * rowH;
    const lines = svg("g");
    picture.append(lines);
    const tokens = [];
    data.tokens.forEach((tok, i) => {
      [["q", left, "end"], ["k", right, "start"]].forEach(([side, x, anchor]) => {
        const t = svg("text", {x, y: y(i), "text-anchor": anchor, tabindex: 0, class: `tok ${side}`,
                               "data-side": side, "data-index": i});
        t.textContent = tok;
        t.addEventListener("mouseenter", () => focus(side, i));
        t.addEventListener("mouseleave", () => focus(side, null));
        t.addEventListener("click", () => {
          const f = state.focus, on = f && f.side === side && f.index === i && state.pinned;
          state.pinned = false;
          focus(side, on ? null : i, true);
        });
        t.addEventListener("focus", () => { if (t.matches(":focus-visible")) focus(side, i, true); });
        tokens.push(t);
        picture.append(t);
      });
    });
    function draw() {
      headButtons.forEach((b, h) => b.setAttribute("aria-pressed", state.heads.has(h)));
      lines.replaceChildren();
      const f = state.focus;
      [...state.heads].sort((a, b) => a - b).forEach((h) => {
        for (let q = 0; q < T; q++) {
          if (f && f.side === "q" && f.index !== q) continue;
          let top = 0;
          for (let k = 0; k < T; k++) top = Math.max(top, weight(state.layer, h, q, k));
          for (let k = 0; k < T; k++) {
            if (f && f.side === "k" && f.index !== k) continue;
            const v = weight(state.layer, h, q, k);
            if (v < 0.01 || v < 0.05 * top) continue;  // a long sentence: its lines that show
            const line = svg("line", {x1: left + 6, y1: y(q) - 5, x2: right - 6, y2: y(k) - 5,
                                      stroke: color(h), "stroke-width": 1 + 3 * v,
                                      "stroke-opacity": Math.min(1, 0.15 + v),
                                      "data-head": h + 1, "data-q": q, "data-k": k});
            const title = svg("title");
            const what = w16 === shown.effect ? " effect" : "";
            title.textContent = `head ${h + 1}${what}: ${data.tokens[q]} → ${data.tokens[k]} ${fmt(v)}`;
            line.append(title);
            lines.append(line);
          }
        }
      });
      tokens.forEach((t) => {
        const side = t.dataset.side, i = +t.dataset.index;
        const on = f && f.side === side && f.index === i;
        t.setAttribute("class", `tok ${side}` + (on ? " on" : f && f.side === side ? " dim" : ""));
      });
      readout.textContent = describe();
    }
    function describe() {
      const f = state.focus;
      if (!f || !state.heads.size) return "";
      const heads = [...state.heads].sort((a, b) => a - b);
      const parts = heads.map((h) => {
        let best = 0, arg = 0;
        for (let j = 0; j < T; j++) {
          const v = f.side === "q" ? weight(state.layer, h, f.index, j) : weight(state.layer, h, j, f.index);
          if (v > best) { best = v; arg = j; }
        }
        const other = data.tokens[arg];
        return `head ${h + 1}: ${f.side === "q" ? "→ " + other : other + " →"} ${fmt(best)}`;
      });
      const who = data.tokens[f.index];
      const what = w16 === shown.effect ? " (effect weights)" : "";
      return `${f.side === "q" ? who + " attends most to" : "attending most to " + who}${what}: ` + parts.join("; ");
    }
    document.addEventListener("keydown", (e) => {
      if (e.target.closest("select")) return;
      const f = state.focus;
      if (e.key === "ArrowDown" || e.key === "ArrowUp") {
        const step = e.key === "ArrowDown" ? 1 : -1;
        const i = f ? Math.min(T - 1, Math.max(0, f.index + step)) : 0;
        focus(f ? f.side : "q", i, true);
        e.preventDefault();
      } else if ((e.key === "ArrowLeft" || e.key === "ArrowRight") && layers.length > 1) {
        state.layer = Math.min(layers.length - 1, Math.max(0, state.layer + (e.key === "ArrowRight" ? 1 : -1)));
        document.getElementById("layer").value = state.layer;
        draw();
      } else if (/^[1-9]$/.test(e.key) && +e.key <= H) {
        headButtons[+e.key - 1].click();
      } else if (e.key === "e" && effectButton) {
        effectButton.click();
      } else if (e.key === "Escape") {
        state.pinned = false; focus("q", null);
      }
    });
    if (layers.length * H > 1) paintTiles = modelView(weight, (l, h) => {
      state.layer = l; state.heads = new Set([h]);
      if (layers.length > 1) document.getElementById("layer").value = l;
      draw();
      picture.scrollIntoView({block: "nearest"});
    });
    draw();
  }

  function modelView(weight, open) {
    const T = data.tokens.length, H = data.heads, layers = data.layer_numbers;
    const size = Math.max(48, Math.min(96, T * 4));  // pixels a tile takes on the page
    const grid = el("div", {class: "tiles", id: "model-view",
                            style: `grid-template-columns: auto repeat(${H}, auto)`});
    grid.append(el("span"), ...[...Array(H).keys()].map((h) => el("span", {class: "label", text: h + 1})));
    const tiles = [];
    layers.forEach((n, l) => {
      grid.append(el("span", {class: "label", text: `layer ${n}`}));
      for (let h = 0; h < H; h++) {
        const canvas = el("canvas", {width: T, height: T, style: `width:${size}px;height:${size}px`});
        tiles.push([canvas, l, h]);
        grid.append(el("button", {class: "tile", "data-layer": n, "data-head": h + 1,
                                  "aria-label": `layer ${n} head ${h + 1}`,
                                  title: `layer ${n}, head ${h + 1}: click to open it above`,
                                  onclick: () => open(l, h)}, canvas));
      }
    });
    function paint() {  /* every tile, from what `weight` reads now (weights or effect) */
      tiles.forEach(([canvas, l, h]) => {
        const ctx = canvas.getContext("2d"), img = ctx.createImageData(T, T);
        let top = 0;
        for (let q = 0; q < T; q++) for (let k = 0; k < T; k++) top = Math.max(top, weight(l, h, q, k));
        for (let q = 0; q < T; q++) for (let k = 0; k < T; k++) {
          const [r, g, b] = ramp(weight(l, h, q, k) / (top || 1)), o = 4 * (q * T + k);
          img.data[o] = r; img.data[o + 1] = g; img.data[o + 2] = b; img.data[o + 3] = 255;
        }
        ctx.putImageData(img, 0, 0);
      });
    }
    paint();
    root.append(el("h2", {text: "Model view: every head (click one to open it above)"}), grid);
    return paint;
  }
  function ramp(x) { /* viridis, five stops */
    const stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
    const p = Math.max(0, Math.min(1, x)) * 4, i = Math.min(3, Math.floor(p)), t = p - i;
    return stops[i].map((c, j) => Math.round(c + (stops[i + 1][j] - c) * t));
  }

  /* ---- explain: one token's walk through every head ---- */
  function explainView() {
    root.append(el("p", {text: `The query is '${data.token}' (position ${data.position}). ` +
      `Each head: q·k for every key, ÷ √d_k = ${data.sqrt_dk}, softmax, then Σ w·v. ` +
      "Click a key's row for its products." +
      (data.heads[0].why ? " Hover a key for its score split into each source's share (--why: the " +
        "source's own q·k term and half of each term it shares; the terminal lists the terms); below each head, " +
        "the weights again without each source." : "") +
      (data.heads[0].terms[0].effect != null ? " Effect (orange bar): the weight × the length of " +
        "what the key's value moves through W_O, renormalised (Kobayashi et al. 2020)." : "")}));
    data.heads.forEach((hw, n) => {
      const table = el("table", {class: "walk"});
      const effect = hw.terms[0].effect !== null && hw.terms[0].effect !== undefined;
      const names = ["key", "q·k", "÷ √d_k", "weight", ...(effect ? ["effect"] : []), ""];
      table.append(el("tr", {}, ...names.map((t, i) =>
        el("th", {class: i && i < names.length - 1 ? "num" : "", text: t}))));
      const readout = el("p", {class: "readout mono why", "aria-live": "polite"});
      hw.terms.forEach((t, j) => {
        const products = el("tr", {class: "products", hidden: ""},
          el("td", {colspan: names.length, text: t.products.map(([a, b]) => `${fmt(a)}×${fmt(b)}`).join(" + ") +
                                      ` = ${fmt(t.dot)}`}));
        const row = el("tr", {class: t.masked ? "term masked" : "term", tabindex: 0,
                              "data-token": t.token},
          el("td", {class: "tok", text: t.token}), el("td", {class: "num", text: fmt(t.dot)}),
          el("td", {class: "num", text: t.masked ? "masked" : fmt(t.scaled)}),
          el("td", {class: "num weight", text: fmt(t.weight)}),
          ...(effect ? [el("td", {class: "num effect", text: fmt(t.effect)})] : []),
          el("td", {}, el("span", {class: "bar", style: `width:${Math.round(120 * t.weight)}px`}),
             ...(effect ? [el("span", {class: "bar effect", style: `width:${Math.round(120 * t.effect)}px`})] : [])));
        const flip = () => products.toggleAttribute("hidden");
        if (hw.why) row.addEventListener("mouseenter", () => { readout.textContent = whyText(hw.why, t.token, j); });
        row.addEventListener("click", flip);
        row.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { flip(); e.preventDefault(); } });
        table.append(row, products);
      });
      const details = el("details", {class: "head", "data-head": hw.head},
        el("summary", {text: `head ${hw.name || hw.head} (dims ${hw.dims[0]}–${hw.dims[1] - 1}` +
                              (hw.kv_head !== hw.head ? `, K/V head ${hw.kv_head}` : "") + ")"}),
        table, ...(hw.why ? [readout, withoutTable(hw.why)] : []),
        el("p", {class: "mono", text: `Σ w·v = [${hw.output.map((x) => fmt(x)).join(", ")}]`}));
      if (n === 0) details.setAttribute("open", "");
      root.append(details);
    });
    root.append(el("h2", {text: "The heads side by side, then W_O"}),
      el("p", {class: "mono", id: "concat", text: `concat = [${data.concat.map((x) => fmt(x)).join(", ")}]`}),
      el("p", {class: "mono", id: "output", text: `output = [${data.output.map((x) => fmt(x)).join(", ")}]`}));
  }

  function whyText(why, token, j) {  /* --why: a hovered key's score, by source */
    const k = why.keys[j], shown = k.parts.map(([n, v]) => `${n} ${v >= 0 ? "+" : "−"}${fmt(Math.abs(v), 3)}`);
    const rest = why.sources > k.parts.length ? ` + ${why.sources - k.parts.length} smaller sources` : "";
    return `${token}: score ${fmt(k.score)} = ${shown.join(", ")}${rest}`;
  }
  function withoutTable(why) {  /* --why: the weights without each source that moves them most */
    const table = el("table", {class: "walk without"});
    table.append(el("tr", {}, el("th", {text: "without"}), ...data.tokens.map((t) => el("th", {class: "num", text: t}))));
    why.without.forEach(([name, weights]) => table.append(el("tr", {"data-source": name},
      el("td", {class: "tok", text: name}), ...weights.map((x) => el("td", {class: "num", text: fmt(x)})))));
    return table;
  }

  /* ---- tiled: one query row through FlashAttention-2's loop, a tile at a time ---- */
  function tiledView() {
    const num = (x) => (x === null ? "−inf" : fmt(x));
    const vec = (v) => `[${v.slice(0, 8).map((x) => fmt(x)).join(", ")}${v.length > 8 ? ", …" : ""}]`;
    let step = 0;
    const last = data.heads[0].tiles.length - 1;
    const counter = el("span", {class: "mono", id: "tile-step"});
    const back = el("button", {id: "tile-back", text: "◀ previous tile (p)", onclick: () => go(step - 1)});
    const next = el("button", {id: "tile-next", text: "next tile (n) ▶", onclick: () => go(step + 1)});
    root.append(el("p", {text: `The query is '${data.token}' (position ${data.position}); the keys ` +
      `come in tiles of ${data.block_k}. For each tile: m = max(m_old, its scores); rescale = ` +
      "exp(m_old − m) shrinks what was summed so far; p = exp(score − m); ℓ = rescale · ℓ_old + Σ p; " +
      "o = rescale · o_old + Σ p · v. After the last tile the output is o ÷ ℓ. Step with the " +
      "buttons or the n and p keys."}), el("div", {class: "controls"}, back, next, counter));
    const heads = data.heads.map((hw, n) => {
      const table = el("table", {class: "walk tiled"});
      table.append(el("tr", {}, ...["tile", "key", "score", "p = exp(s − m)"].map((t, i) =>
        el("th", {class: i > 1 ? "num" : "", text: t}))));
      const rows = hw.tiles.map((tile, i) => tile.keys.map((key, j) => {
        const row = el("tr", {"data-tile": i + 1},
          el("td", {text: j ? "" : String(i + 1)}), el("td", {class: "tok", text: key}),
          el("td", {class: "num", text: num(tile.scores[j])}), el("td", {class: "num", text: fmt(tile.p[j])}));
        table.append(row);
        return row;
      }));
      const readout = el("p", {class: "readout mono", "aria-live": "polite", "data-head": hw.head});
      const details = el("details", {class: "head", "data-head": hw.head, open: ""},
        el("summary", {text: `head ${hw.name}`}), table, readout);
      root.append(details);
      return {hw, rows, readout};
    });
    function go(i) {
      step = Math.max(0, Math.min(last, i));
      counter.textContent = `tile ${step + 1} of ${last + 1}`;
      back.disabled = step === 0;
      next.disabled = step === last;
      heads.forEach(({hw, rows, readout}) => {
        rows.forEach((tileRows, t) => tileRows.forEach((r) => {
          r.classList.toggle("sel", t === step);
          r.classList.toggle("masked", t > step);  // not read yet
        }));
        const tile = hw.tiles[step];
        const lines = [`m = max(${num(tile.m_old)}, this tile's scores) = ${num(tile.m)}`,
          step ? `rescale = exp(${num(tile.m_old)} − ${num(tile.m)}) = ${fmt(tile.rescale)}` : "rescale: nothing summed yet",
          `ℓ = ${fmt(tile.rescale)} · ${fmt(tile.l_old)} + Σ p = ${fmt(tile.l)}`,
          `o = ${vec(tile.o)}; o ÷ ℓ so far = ${vec(tile.o.map((x) => (tile.l ? x / tile.l : 0)))}`];
        if (step === last) lines.push(`output o ÷ ℓ = ${vec(hw.output)}; softmax(scores) · V at once: ` +
                                      `${vec(hw.explicit)}; L = m + log ℓ = ${num(hw.lse)}`);
        readout.textContent = lines.join("\n");
      });
    }
    document.addEventListener("keydown", (e) => {
      if (e.key === "n") next.click();
      if (e.key === "p") back.click();
    });
    go(0);
  }

  /* ---- shapes: the trace beside the module's source ---- */
  function shapesView() {
    const table = el("table", {class: "steps"});
    table.append(el("tr", {}, ...["#", "code", "op", "shape", "stride", "contig", "view", "dtype", "alloc"]
      .map((t) => el("th", {text: t}))));
    const source = el("div", {class: "source mono", id: "source"});
    const lines = data.source.map((text, i) => {
      const div = el("div", {"data-line": i + 1}, el("span", {class: "n", text: i + 1}), text);
      source.append(div);
      return div;
    });
    const rows = data.steps.map((s, i) => {
      const row = el("tr", {tabindex: 0, "data-step": i + 1, "data-line": s.line || ""},
        ...[i, s.code, s.op, `[${s.shape.join(", ")}]`, `(${s.stride.join(",")})`,
            s.contiguous ? "yes" : "no", s.view ? "view" : "copy",
            s.dtype.replace("bfloat", "bf").replace("float", "f").replace("int", "i"), s.alloc]
          .map((t, j) => el("td", {class: j === 1 ? "mono" : j > 2 ? "num" : "", text: t})));
      row.addEventListener("click", () => select(i));
      row.addEventListener("focus", () => select(i));
      table.append(row);
      return row;
    });
    function select(i) {
      rows.forEach((r, j) => r.classList.toggle("sel", j === i));
      lines.forEach((d) => d.classList.remove("sel", "from"));
      const s = data.steps[i];
      [[s.called_from, "from"], [s.line, "sel"]].forEach(([n, cls]) => {
        if (n && lines[n - 1]) { lines[n - 1].classList.add(cls); reveal(lines[n - 1]); }
      });
    }
    function reveal(node) {  // scroll its own pane, never the page
      const pane = node.closest(".scroll");
      if (node.offsetTop < pane.scrollTop || node.offsetTop > pane.scrollTop + pane.clientHeight - 40)
        pane.scrollTop = node.offsetTop - pane.clientHeight / 3;
    }
    table.addEventListener("keydown", (e) => {
      const i = rows.indexOf(document.activeElement);
      if (i < 0) return;
      const next = e.key === "ArrowDown" || e.key === "j" ? i + 1 : e.key === "ArrowUp" || e.key === "k" ? i - 1 : null;
      if (next !== null && rows[next]) { rows[next].focus(); reveal(rows[next]); e.preventDefault(); }
    });
    root.append(el("p", {class: "hint", text: `Every operation of the forward pass as it ran. Click a ` +
      `row, or move with ↑ ↓: its line of ${data.file} lights up (a helper's caller in blue).`}),
      el("div", {class: "split"}, el("div", {class: "scroll"}, table), el("div", {class: "scroll"}, source)));
    const first = data.steps.findIndex((s) => s.line);
    if (rows.length) select(Math.max(0, first));
  }

  /* ---- patching: the share of the gap each patched activation restores (or destroys) ---- */
  function patchingView() {
    const [clean, corrupt] = data.values;
    const differ = data.clean.map((t, i) => t !== data.corrupt[i]);
    const way = data.noising ? "destroys" : "restores";
    const readout = el("p", {class: "readout mono", id: "patch-readout", "aria-live": "polite"});
    const shade = (x) => {  // red: restores, blue: works against; white: nothing
      const a = Math.min(1, Math.abs(x));
      const [r, g, b] = x >= 0 ? [214, 39, 40] : [31, 119, 180];
      return `rgba(${r},${g},${b},${(a * 0.85).toFixed(3)})`;
    };
    function grid(id, title, g, rows, cols, describe) {
      const table = el("table", {class: "patch", id});
      table.append(el("tr", {}, el("th", {text: ""}), ...cols.map((c) => el("th", {class: "num", text: c}))));
      g.fraction.forEach((row, i) => table.append(el("tr", {}, el("th", {class: "tok", text: rows[i]}),
        ...row.map((x, j) => {
          const shown = fmt(x, 2) === "-0.00" ? "0.00" : fmt(x, 2);
          const cell = el("td", {class: "num", tabindex: 0, text: shown, style: `background:${shade(x)}`,
                                 "data-row": i, "data-col": j});
          const say = () => { readout.textContent = describe(i, j, x, g.metric[i][j]); };
          cell.addEventListener("mouseenter", say);
          cell.addEventListener("focus", say);
          return cell;
        }))));
      root.append(el("h2", {text: title}), el("div", {class: "scroll"}, table));
    }
    const positions = data.clean.map((t, i) => `${i} ${t}${differ[i] ? "*" : ""}`);
    const layers = data.heads.fraction.map((_, l) => String(l + 1));
    const heads = data.heads.fraction[0].map((_, h) => String(h + 1));
    const share = (x) => `${way} ${fmt(x, 4)} of the gap`;
    root.append(el("p", {text: `Clean: ${data.clean.join(" ")} (${fmt(clean)}). Corrupted: ` +
      `${data.corrupt.join(" ")} (${fmt(corrupt)}). Each cell: the share of the gap the activation ` +
      `${way} when copied ${data.noising ? "from the corrupted run into the clean one" : "from the clean run into the corrupted one"}` +
      " (1 = all of it; red restores, blue works against). Hover or focus a cell for its numbers. " +
      "Positions marked * are where the texts differ." +
      (data.undefined ? ` But ${data.undefined}: no share is defined (—); hover a cell for its metric.` : "")}), readout);
    const residual = {fraction: data.residual.fraction[0].map((_, t) => data.residual.fraction.map((r) => r[t])),
                      metric: data.residual.metric[0].map((_, t) => data.residual.metric.map((r) => r[t]))};
    grid("patch-residual", "The residual stream entering each layer, by position", residual, positions, layers,
         (t, l, x, m) => `position ${t} '${data.clean[t]}', entering layer ${l + 1}: ${share(x)} (metric ${fmt(m)})`);
    grid("patch-heads", data.spearman === null ? "Each head's output (Spearman's ρ against attribution patching's " +
           `ranking is undefined: ${data.heads.fraction.flat().length < 2 ? "one head, nothing to rank" : "no gap"})` :
           `Each head's output (attribution patching's ranking follows it with Spearman ρ = ${fmt(data.spearman, 2)})`,
         data.heads, layers, heads, (l, h, x, m) => `head ${l + 1}.${h + 1}: ${share(x)} (metric ${fmt(m)}); ` +
         `attribution patching's estimate ${fmt(data.attribution.fraction[l][h], 4)}`);
    if (data.queries) {
      const share3 = data.queries.fraction[0].length / data.kv_groups.fraction[0].length;
      grid("patch-queries", "Each head's queries alone", data.queries, layers, heads,
           (l, h, x, m) => `head ${l + 1}.${h + 1}'s queries: ${share(x)} (metric ${fmt(m)})`);
      grid("patch-kv", `Each K/V group's keys and values${share3 > 1 ? ` (each serves ${share3} query heads)` : ""}`,
           data.kv_groups, layers, data.kv_groups.fraction[0].map((_, g) => share3 > 1 ?
             `${g + 1} (heads ${g * share3 + 1}-${(g + 1) * share3})` : String(g + 1)),
           (l, g, x, m) => `layer ${l + 1}, K/V group ${g + 1}${share3 > 1 ? ` (query heads ${g * share3 + 1}-${(g + 1) * share3} read it)` : ""}: ${share(x)} (metric ${fmt(m)})`);
    }
    if (data.by_position) {
      const [l, h] = data.by_position.head;
      grid("patch-positions", `Head ${l}.${h}'s output, one position at a time`,
           {fraction: [data.by_position.fraction], metric: [data.by_position.metric]}, [`${l}.${h}`], positions,
           (_, t, x, m) => `head ${l}.${h} at position ${t} '${data.clean[t]}' alone: ${share(x)} (metric ${fmt(m)})`);
    }
  }

  /* ---- path: one sender's (or several senders') output into a receiver, through each input ---- */
  function pathView() {
    const names = {q: "its queries", k: "its keys", v: "its values", qkv: "all three"};
    const way = data.noising ? "destroys" : "restores";
    root.append(el("p", {text: `Clean ${fmt(data.values[0])}, corrupted ${fmt(data.values[1])}. The ` +
      `output of ${data.senders} reaches ${data.receiver} only through the input named; every other ` +
      "path is the target run's (Wang et al. 2022's path patching). A head's weights do not depend " +
      "on its values: a score read off them moves through q and k alone." +
      (data.undefined ? ` But ${data.undefined}: no share is defined (—).` : "")}));
    const table = el("table", {class: "walk", id: "path-table"});
    table.append(el("tr", {}, ...["through", "metric", `share of the gap it ${way}`].map((t, i) =>
      el("th", {class: i ? "num" : "", text: t}))));
    data.via.forEach((row) => {
      const bar = el("span", {class: "bar", style: `width:${Math.round(Math.min(1, Math.abs(row.fraction)) * 200)}px`});
      table.append(el("tr", {"data-input": row.input}, el("td", {text: names[row.input]}),
        el("td", {class: "num", text: fmt(row.metric)}),
        el("td", {class: "num"}, `${fmt(row.fraction, 2) === "-0.00" ? "0.00" : fmt(row.fraction, 2)} `, bar)));
    });
    root.append(table);
  }

  /* ---- hearing: where each of Whisper's text tokens listens, tokens down and time across ---- */
  function hearingView() {
    const T = data.tokens.length, F = data.matrix[0].length, fps = 50;
    const readout = el("p", {class: "readout mono", id: "hear-readout", "aria-live": "polite"});
    root.append(el("p", {text: `Heard: "${data.text}" (${fmt(data.seconds, 2)} s). Each row: where the ` +
      "position that writes the token listens (the published alignment heads' weights over the speech, " +
      "standardised, filtered and averaged as Whisper does), brighter where it listens most; the line " +
      "is the path the word timings read. Hover, or focus the picture and use the arrow keys."}), readout);
    const scale = Math.max(1, Math.floor(900 / F)), rowH = 26;
    const sound = el("canvas", {id: "hear-sound", width: F * scale, height: 60});
    const picture = el("canvas", {id: "hear-picture", width: F * scale, height: T * rowH, tabindex: 0});
    const s = sound.getContext("2d"), g = picture.getContext("2d");
    s.fillStyle = "#21918c";
    data.loudness.forEach((x, f) => s.fillRect(f * scale, 30 - x * 30, scale, x * 60));
    data.matrix.forEach((row, t) => {
      const lo = Math.min(...row), hi = Math.max(...row);
      row.forEach((x, f) => {
        g.fillStyle = `rgb(${ramp(hi > lo ? (x - lo) / (hi - lo) : 0).join(",")})`;
        g.fillRect(f * scale, t * rowH, scale, rowH);
      });
    });
    g.strokeStyle = "#ff4081";
    g.lineWidth = 2;
    g.beginPath();
    data.path.forEach(([t, f], i) => (i ? g.lineTo : g.moveTo).call(g, (f + 0.5) * scale, (t + 0.5) * rowH));
    g.stroke();
    const labels = el("div", {class: "hear-tokens"}, ...data.tokens.map((t) => el("div", {class: "tok", text: t})));
    const cursor = {t: 0, f: 0};
    const say = (t, f) => {
      cursor.t = t; cursor.f = f;
      readout.textContent = `'${data.tokens[t]}' at ${fmt(f / fps, 2)} s: ${fmt(data.matrix[t][f], 3)} ` +
        `(its row from ${fmt(Math.min(...data.matrix[t]), 3)} to ${fmt(Math.max(...data.matrix[t]), 3)})`;
    };
    picture.addEventListener("mousemove", (e) => {
      const box = picture.getBoundingClientRect();
      const f = Math.min(F - 1, Math.floor((e.clientX - box.left) / box.width * F));
      say(Math.min(T - 1, Math.floor((e.clientY - box.top) / box.height * T)), f);
    });
    picture.addEventListener("keydown", (e) => {
      const step = {ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1]}[e.key];
      if (!step) return;
      e.preventDefault();
      say(Math.max(0, Math.min(T - 1, cursor.t + step[0])), Math.max(0, Math.min(F - 1, cursor.f + step[1])));
    });
    root.append(el("h2", {text: `Where each token listens (0 to ${fmt(data.seconds, 2)} s across)`}),
                el("div", {class: "hear"}, el("div", {}), sound, labels, picture));
    if (data.words) {
      const table = el("table", {class: "walk", id: "hear-words"});
      table.append(el("tr", {}, ...["word", "start (s)", "end (s)", ""].map((t, i) =>
        el("th", {class: i && i < 3 ? "num" : "", text: t}))));
      data.words.forEach((w) => {
        const px = (t) => Math.round(t * fps * scale);  // the picture's own time axis
        const bar = el("span", {class: "bar", style: `margin-left:${px(w.start)}px;` +
                                                       `width:${Math.max(2, px(w.end) - px(w.start))}px`});
        const row = el("tr", {tabindex: 0}, el("td", {text: w.word}), el("td", {class: "num", text: fmt(w.start, 2)}),
                       el("td", {class: "num", text: fmt(w.end, 2)}), el("td", {}, bar));
        const tell = () => { readout.textContent = `'${w.word}': ${fmt(w.start, 2)} to ${fmt(w.end, 2)} s`; };
        row.addEventListener("mouseenter", tell);
        row.addEventListener("focus", tell);
        table.append(row);
      });
      root.append(el("h2", {text: "When each word is said"}), table);
    }
    const table = el("table", {class: "patch", id: "hear-heads"});
    const L = data.disagreement.length, H = data.disagreement[0].length;
    const top = Math.max(...data.disagreement.flat()), low = Math.min(...data.disagreement.flat());
    table.append(el("tr", {}, el("th", {text: "layer"}), ...[...Array(H).keys()].map((h) => el("th", {class: "num", text: `head ${h + 1}`}))));
    data.disagreement.forEach((row, l) => table.append(el("tr", {}, el("th", {text: String(l + 1)}),
      ...row.map((x, h) => {
        const name = `${l + 1}.${h + 1}`, published = data.published.includes(name);
        const cell = el("td", {class: "num", tabindex: 0, text: fmt(x, 3) + (published ? "*" : " "),
                               "data-head": name,
                               style: `background:rgb(${ramp(1 - (x - low) / ((top - low) || 1)).join(",")});` +
                                      `color:${1 - (x - low) / ((top - low) || 1) > 0.55 ? "#000" : "#fff"}`});
        const lag = data.following.includes(name) ?
          `; it enters the tokens ${fmt(Math.abs(data.lag[l][h]), 2)} s ${data.lag[l][h] < 0 ? "before" : "after"} the ${data.following.length} that disagree least (median)` : "";
        const tell = () => { readout.textContent = `head ${name}: its path lands ${fmt(x, 3)} s from the ` +
          `others' (median)${lag}${published ? "; a published alignment head" : ""}${data.found.includes(name) ? "; among the 8 ranked first" : ""}`; };
        cell.addEventListener("mouseenter", tell);
        cell.addEventListener("focus", tell);
        return cell;
      }))));
    root.append(el("h2", {text: `Each cross-attention head's disagreement (s); * published. ` +
      `Precision@8: ${data.precision} of 8 (chance ${fmt(data.chance, 1)})`}), table);
  }

  ({heads: headsView, explain: explainView, tiled: tiledView, shapes: shapesView,
    patching: patchingView, path: pathView, hearing: hearingView})[data.kind]();
})();

// Runs the page served at argv[2] in jsdom (its scripts, against the real server) and prints
// one JSON line per scenario: what the page shows after streaming, drawing and explaining.
// Used by tests/serve/test_page.py where node can load jsdom (NODE_PATH). argv[3], if given, is
// JSON {source, kind, settings}: one scenario with that input, switching the map to that kind.
"use strict";
const { JSDOM } = require("jsdom");

const base = process.argv[2];
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function scenario(w, d, settings, source = "3 1 4", kind = "encoder") {
  d.getElementById("translate").reset();
  d.getElementById("source").value = source;
  for (const [name, value] of Object.entries(settings)) {
    d.querySelector(`input[name=${name}]`).value = value;
  }
  d.getElementById("translate").dispatchEvent(new w.Event("submit", { cancelable: true }));
  await sleep(100);
  for (let i = 0; i < 100; i++) {
    if (!d.getElementById("explain-section").hidden || d.getElementById("error").textContent) break;
    await sleep(100);
  }
  const seen = {
    error: d.getElementById("error").textContent,
    outputs: [...d.querySelectorAll(".output .text")].map((o) => o.textContent),
    chosen: d.querySelector(".output.chosen") ? d.querySelector(".output.chosen").id : null,
    explainRows: d.querySelectorAll("table.explain tr").length,
    label: d.getElementById("source-label").textContent,
    button: d.getElementById("go").textContent,
    explainHeader: [...d.querySelectorAll("table.explain th")].map((th) => th.textContent),
  };
  const root = d.getElementById("root");
  if (!root) return seen;
  seen.rendered = root.dataset.rendered;
  seen.cells = d.querySelectorAll("#root td").length;
  d.querySelector("#root td").dispatchEvent(new w.MouseEvent("mouseenter"));
  seen.hover = d.getElementById("hover").textContent;
  seen.kinds = [...d.querySelectorAll("#kind option")].map((o) => o.value);
  for (const [id, value] of [["kind", kind], ["head", "1"]]) {
    d.getElementById(id).value = value;
    d.getElementById(id).dispatchEvent(new w.Event("change"));
  }
  seen.renderedAfter = root.dataset.rendered;
  return seen;
}

(async () => {
  const html = await (await fetch(base)).text();
  const errors = [];
  const dom = new JSDOM(html, {
    url: base,
    runScripts: "dangerously",
    pretendToBeVisual: true,
    beforeParse(window) {
      window.fetch = (path, options) => fetch(new URL(path, base), options);
      window.TextDecoder = TextDecoder;
      window.addEventListener("error", (event) => errors.push(String(event.message)));
    },
  });
  const w = dom.window, d = w.document;
  await sleep(300);
  if (process.argv[3]) {
    const { source, kind, settings } = JSON.parse(process.argv[3]);
    console.log(JSON.stringify({ settings, ...(await scenario(w, d, settings, source, kind)) }));
  } else {
    const scenarios = [{}, { beam_size: 3, n_best: 2 }, { temperature: 1, num_samples: 2, seed: 5 },
                       { beam_size: 0 }];
    for (const settings of scenarios) {
      console.log(JSON.stringify({ settings, ...(await scenario(w, d, settings)) }));
    }
  }
  console.log(JSON.stringify({ model: d.getElementById("model").textContent, errors }));
  process.exit(0);
})();

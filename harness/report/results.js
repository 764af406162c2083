// report.html: the results table (filters, column chooser, sorting) and the per-case view (#case/<id>),
// both drawn from the rows' JSON in <script id="rows-data">.
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("rows-data").textContent);
  var esc = function (s) {
    return String(s == null ? "" : s).replace(/[&<>"]/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c];
    });
  };
  var num = function (x, d) {
    if (x == null || x === "") return "";
    if (typeof x === "string") return x;
    var a = Math.abs(x);
    if (a === 0) return "0";
    if (a >= 1e5 || a < 1e-2) return x.toExponential((d || 3) - 1);
    if (a >= 1000) return x.toFixed(0);
    return String(Number(x.toPrecision(d || 3)));
  };
  var reason = function (r) { return r.r == null ? "" : D.reasons[r.r]; };
  var caseOf = function (r) { return D.cases[r.c]; };
  var repro = function (r) {
    return (r.ti ? "TRITON_INTERPRET=1 " : "") + D.repro[0] + " " + caseOf(r).id + " --backend " + D.backends[r.b] + " " + D.repro[1];
  };
  var errLine = function (r) { // "o 2.24e-04/7.31e-04; k_cache exact" from the detail rows
    return (r.d || []).map(function (d) { return d[1] === "bitwise" ? d[0] + " " + d[2] : d[0] + " " + d[1] + "/" + d[2]; }).join("; ");
  };
  var pinfo = function (r) {
    if (!r.pi) return "";
    var t = r.pi.length > 160 ? r.pi.slice(0, 160) + "…" : r.pi;
    return "<div class='pinfo' title='" + esc(r.pi) + "'>prepare: " + esc(t) + "</div>";
  };
  var timeCell = function (r) {
    if (r.m == null) return "";
    var s = num(r.m);
    if (r.s !== "pass") s = "<s title='did not pass: never ranked'>" + s + "</s>";
    if (r.k && r.k !== "gpu") s += " <span class='kind'>" + r.k + "</span>";
    if (r.g) s += " <span class='flag'>" + esc(r.g) + "</span>";
    return s;
  };
  var pct = function (x) { return x == null ? "" : (100 * x).toFixed(1) + "%"; };
  // How a cell is drawn, by the `render` its column declares (harness/store/columns.py PAGE_COLUMNS).
  var RENDER = {
    text: function (r, c) { return esc(c.v(r)); },
    num: function (r, c) { return num(c.v(r)); },
    case: function (r) {
      var why = reason(r), s = "<a href='#case/" + esc(caseOf(r).id) + "'>" + esc(caseOf(r).id) + "</a>";
      if (why) s += "<div class='reason st-" + r.s + "' title='" + esc(why) + "'>" + esc(why.length > 200 ? why.slice(0, 200) + "…" : why) + "</div>";
      return s;
    },
    status: function (r) { return "<span class='st st-" + r.s + "'>" + r.s + "</span>"; },
    errors: function (r) { return esc(errLine(r)) + (r.w ? "<div class='warn small'>tolerance: " + esc(r.w) + "</div>" : ""); },
    time: timeCell,
    spread: function (r) { return r.lo == null ? "" : num(r.lo) + "–" + num(r.hi); },
    percent: function (r, c) { return pct(c.v(r) === "" ? null : c.v(r)); },
    roofline: function (r, c) { var x = c.v(r); return x === "" ? "" : x.toFixed(0) + "%"; },
    times: function (r, c) { var x = c.v(r); return x === "" ? "" : x.toFixed(2) + "×"; },
    prepare: function (r) { return num(r.p) + pinfo(r); },
    reason: function (r) { return esc(reason(r)) + pinfo(r); }
  };
  // What a column shows and sorts by: a key of the row's data ("e.o": a key inside one), or derived.
  var DERIVED = {
    "@case": function (r) { return caseOf(r).id; },
    "@op": function (r) { return caseOf(r).op; },
    "@backend": function (r) { return D.backends[r.b]; },
    "@features": function (r) { return caseOf(r).f.join(" "); },
    "@repro": repro,
    "@reason": reason
  };
  var reader = function (path) {
    if (DERIVED[path]) return DERIVED[path];
    var keys = path.split(".");
    return function (r) {
      var x = r;
      for (var i = 0; i < keys.length && x != null; i++) x = x[keys[i]];
      return x == null ? "" : x;
    };
  };
  var COLS = D.columns.map(function (c) {
    return { k: c.key, h: c.header, on: c.shown, v: reader(c.value), f: RENDER[c.render] || RENDER.text, cls: c.cls,
             cf: c["case"] ? RENDER[c["case"]] || RENDER.text : null };
  });
  var PAGE = 250; // rows drawn at once: a table of thousands of rows takes seconds to lay out
  var shown = {}, sortCol = null, sortAsc = true, limit = PAGE;
  COLS.forEach(function (c) { shown[c.k] = !!c.on; });
  var table = document.getElementById("t-results");
  var filters = {};
  document.querySelectorAll("#results-filter [data-f]").forEach(function (el) {
    filters[el.getAttribute("data-f")] = el;
    el.addEventListener(el.tagName === "INPUT" ? "input" : "change", function () { limit = PAGE; draw(); });
  });
  var chooser = document.getElementById("col-chooser");
  COLS.forEach(function (c) {
    var l = document.createElement("label");
    l.innerHTML = "<input type='checkbox' data-col='" + c.k + "'" + (shown[c.k] ? " checked" : "") + "> " + esc(c.h);
    l.firstChild.addEventListener("change", function (e) { shown[c.k] = e.target.checked; draw(); });
    chooser.appendChild(l);
  });
  function keep(r) {
    var v = function (k) { return filters[k] ? filters[k].value : ""; };
    if (v("op") && caseOf(r).op !== v("op")) return false;
    if (v("backend") && D.backends[r.b] !== v("backend")) return false;
    if (v("status") === "ran" ? r.s === "skip" : v("status") && r.s !== v("status")) return false;
    if (v("feature") && caseOf(r).f.indexOf(v("feature")) < 0) return false;
    var t = v("text").toLowerCase();
    return !t || (caseOf(r).id + " " + D.backends[r.b] + " " + reason(r)).toLowerCase().indexOf(t) >= 0;
  }
  function cmp(a, b) {
    var x = sortCol.v(a), y = sortCol.v(b);
    if (x === y) return 0;
    if (x === "") return 1;
    if (y === "") return -1;
    if (typeof x !== typeof y) return typeof x === "number" ? -1 : 1;
    return (x < y ? -1 : 1) * (sortAsc ? 1 : -1);
  }
  function draw() {
    var cols = COLS.filter(function (c) { return shown[c.k]; });
    var rows = D.rows.filter(keep);
    if (sortCol) rows.sort(cmp);
    table.tHead.innerHTML = "<tr>" + cols.map(function (c) {
      var s = sortCol === c ? (sortAsc ? " class='sorted-asc'" : " class='sorted-desc'") : "";
      return "<th data-k='" + c.k + "'" + s + ">" + esc(c.h) + "</th>";
    }).join("") + "</tr>";
    var all = rows.length;
    rows = rows.slice(0, limit);
    table.tBodies[0].innerHTML = rows.map(function (r) {
      return "<tr data-key='" + r.s + "'>" + cols.map(function (c) {
        return "<td" + (c.cls ? " class='" + c.cls + "'" : "") + ">" + c.f(r, c) + "</td>";
      }).join("") + "</tr>";
    }).join("");
    document.getElementById("results-count").textContent = all + " of " + D.rows.length + " rows" +
      (all > rows.length ? " (first " + rows.length + " drawn)" : "");
    var more = document.getElementById("results-more");
    more.hidden = all <= rows.length;
    more.textContent = "draw all " + all + " rows";
  }
  document.getElementById("results-more").addEventListener("click", function () { limit = Infinity; draw(); });
  table.tHead.addEventListener("click", function (e) {
    var th = e.target.closest("th");
    if (!th) return;
    var c = COLS.filter(function (x) { return x.k === th.getAttribute("data-k"); })[0];
    sortAsc = sortCol === c ? !sortAsc : true;
    sortCol = c;
    draw();
  });
  draw();

  var view = document.getElementById("case-view"), body = document.getElementById("case-body");
  function openCase(id) {
    var ci = -1;
    D.cases.forEach(function (c, i) { if (c.id === id) ci = i; });
    if (ci < 0) { view.hidden = true; return; }
    var c = D.cases[ci], rows = D.rows.filter(function (r) { return r.c === ci; });
    rows.sort(function (a, b) { return (a.x == null) - (b.x == null) || (a.x || 0) - (b.x || 0); });
    var h = "<h2 class='mono'>" + esc(c.id) + "</h2><p class='muted'>" + esc(c.cls) + " · features: " + esc(c.f.join(", ") || "none") + "</p>";
    var inCase = COLS.filter(function (col) { return col.cf; });
    h += "<table><thead><tr>" + inCase.map(function (col) { return "<th>" + esc(col.h) + "</th>"; }).join("") + "</tr></thead><tbody>";
    rows.forEach(function (r) {
      h += "<tr>" + inCase.map(function (col) { return "<td" + (col.cls ? " class='" + col.cls + "'" : "") + ">" + col.cf(r, col) + "</td>"; }).join("") + "</tr>";
    });
    h += "</tbody></table><h3>Errors against the float64 reference</h3><table><thead><tr><th>backend</th>" +
      D.detail.map(function (name) { return "<th>" + esc(name) + "</th>"; }).join("") + "</tr></thead><tbody>";
    rows.forEach(function (r) {
      (r.d || []).forEach(function (d) {
        h += "<tr><td>" + esc(D.backends[r.b]) + "</td>" + d.map(function (x, i) { return "<td" + (i ? " class='num'" : "") + ">" + esc(x) + "</td>"; }).join("") + "</tr>";
      });
    });
    h += "</tbody></table><h3>Repro</h3>" + rows.filter(function (r) { return r.s !== "skip"; }).map(function (r) { return "<code class='repro'>" + esc(repro(r)) + "</code>"; }).join("");
    body.innerHTML = h;
    view.hidden = false;
  }
  function route() {
    var m = /^#case\/(.+)$/.exec(location.hash);
    if (m) openCase(decodeURIComponent(m[1])); else view.hidden = true;
  }
  function close() {
    view.hidden = true;
    if (/^#case\//.test(location.hash)) history.replaceState(null, "", location.pathname + location.search);
  }
  window.addEventListener("hashchange", route);
  document.getElementById("case-close").addEventListener("click", close);
  view.addEventListener("click", function (e) { if (e.target === view) close(); });
  document.addEventListener("keydown", function (e) { if (e.key === "Escape") close(); });
  route();
  var more = document.getElementById("show-broke");
  if (more) more.addEventListener("click", function () {
    document.querySelectorAll(".more-broke").forEach(function (tr) { tr.hidden = false; });
    more.hidden = true;
  });
})();

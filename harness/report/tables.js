// Sortable tables (click a header) and filters (a search box and a select naming data-table, optionally data-col).
(function () {
  "use strict";
  function cellValue(td) {
    if (!td) return "";
    var s = td.getAttribute("data-sort");
    if (s === null) s = td.textContent.trim();
    var n = parseFloat(s);
    return isNaN(n) || !/^[-+]?[0-9.]/.test(s) ? s.toLowerCase() : n;
  }
  function sortBy(table, th, col) {
    var body = table.tBodies[0];
    if (!body) return;
    var rows = Array.prototype.slice.call(body.rows);
    var asc = !th.classList.contains("sorted-asc");
    table.querySelectorAll("th").forEach(function (h) { h.classList.remove("sorted-asc", "sorted-desc"); });
    th.classList.add(asc ? "sorted-asc" : "sorted-desc");
    rows.sort(function (a, b) {
      var x = cellValue(a.cells[col]), y = cellValue(b.cells[col]);
      if (x === y) return 0;
      if (x === "") return 1;
      if (y === "") return -1;
      if (typeof x !== typeof y) return (typeof x === "number" ? -1 : 1);
      return (x < y ? -1 : 1) * (asc ? 1 : -1);
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var head = table.tHead;
    if (!head) return;
    Array.prototype.forEach.call(head.rows[0].cells, function (th, col) {
      th.addEventListener("click", function () { sortBy(table, th, col); });
    });
  });
  function applyFilter(id) {
    var table = document.getElementById(id);
    if (!table || !table.tBodies[0]) return;
    var input = document.querySelector('input[data-table="' + id + '"]');
    var select = document.querySelector('select[data-table="' + id + '"]');
    var text = input ? input.value.toLowerCase() : "";
    var key = select ? select.value : "";
    var shown = 0;
    Array.prototype.forEach.call(table.tBodies[0].rows, function (tr) {
      var col = select ? select.getAttribute("data-col") : null;
      var got = col === null ? tr.getAttribute("data-key") : tr.cells[+col].textContent.trim();
      var ok = (!text || tr.textContent.toLowerCase().indexOf(text) >= 0) && (!key || got === key);
      tr.style.display = ok ? "" : "none";
      if (ok) shown += 1;
    });
    var count = document.querySelector('[data-count="' + id + '"]');
    if (count) count.textContent = shown + " shown";
  }
  document.querySelectorAll(".filter input[data-table], .filter select[data-table]").forEach(function (el) {
    var id = el.getAttribute("data-table");
    el.addEventListener("input", function () { applyFilter(id); });
    el.addEventListener("change", function () { applyFilter(id); });
  });
})();

// The dashboard's own script: confirmations, select-all boxes, the CSRF header on htmx
// requests, and the overview's charts (uPlot) redrawn from the JSON each live update carries.
(function () {
  "use strict";
  var charts = {};

  function series() {
    var node = document.getElementById("dt-series");
    if (!node) return null;
    try { return JSON.parse(node.textContent); } catch (e) { return null; }
  }

  function options(kind, width) {
    var common = {
      width: width, height: 150, legend: { show: true }, scales: { x: { time: true } },
      axes: [{}, { size: 64 }]
    };
    if (kind === "throughput") {
      common.series = [{}, { label: "done", stroke: "#1e7b34", width: 1.5 }, { label: "failed", stroke: "#b3261e", width: 1.5 }];
    } else {
      common.series = [{}, { label: "p50 ms", stroke: "#2d5fb3", width: 1.5 }, { label: "p99 ms", stroke: "#9a6700", width: 1.5 }];
    }
    return common;
  }

  function drawCharts() {
    var data = series();
    if (!data || typeof uPlot === "undefined") return;
    document.querySelectorAll(".chart").forEach(function (figure) {
      var queue = figure.getAttribute("data-queue");
      var plot = figure.querySelector(".plot");
      var kind = plot.getAttribute("data-kind");
      var s = data[queue];
      if (!s) return;
      var rows = kind === "throughput" ? [s.t, s.done, s.failed] : [s.t, s.p50, s.p99];
      var key = queue + "/" + kind;
      var existing = charts[key];
      if (existing && existing.root.isConnected) {
        existing.setData(rows);
      } else {
        plot.innerHTML = "";
        charts[key] = new uPlot(options(kind, Math.max(300, figure.clientWidth - 10)), rows, plot);
      }
      plot.replaceChildren(charts[key].root);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    window.dtLoadedAt = Date.now();
    drawCharts();
  });
  document.addEventListener("htmx:afterSettle", drawCharts);
  document.addEventListener("htmx:configRequest", function (event) {
    event.detail.headers["X-CSRF-Token"] = document.body.getAttribute("data-csrf") || "";
  });
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!box.classList || !box.classList.contains("select-all")) return;
    var table = box.closest("table");
    table.querySelectorAll('input[name="ids"]').forEach(function (other) { other.checked = box.checked; });
  });
})();

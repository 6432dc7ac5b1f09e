// The one chart of a job's page: its nodes' score band (lowest, mean, highest), its lowest nodes and the threshold
// over time (uPlot, vendored beside this file). The data is the page's JSON block; without
// JavaScript the page's tables say the same.
(function () {
  "use strict";
  var box = document.getElementById("scores");
  var block = document.getElementById("scores-data");
  if (!box || !block || typeof uPlot === "undefined") return;
  var d = JSON.parse(block.textContent);
  // one x axis: every time any series has a point at, sorted
  var times = {};
  d.band.forEach(function (b) { times[b[0]] = true; });
  d.thresholds.forEach(function (p) { times[p[0]] = true; });
  d.series.forEach(function (s) { s.points.forEach(function (p) { times[p[0]] = true; }); });
  var xs = Object.keys(times).map(Number).sort(function (a, b) { return a - b; });
  var at = {};
  xs.forEach(function (x, i) { at[x] = i; });
  function column(points, pick) {
    var out = xs.map(function () { return null; });
    points.forEach(function (p) { out[at[p[0]]] = pick(p); });
    return out;
  }
  var data = [xs,
    column(d.band, function (b) { return b[1]; }),
    column(d.band, function (b) { return b[2]; }),
    column(d.band, function (b) { return b[3]; }),
    column(d.thresholds, function (p) { return p[1]; })];
  var colours = ["#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  var series = [{},
    {label: "lowest", stroke: "#bbb", dash: [4, 4]},
    {label: "mean", stroke: "#2ca02c", width: 2},
    {label: "highest", stroke: "#bbb", dash: [4, 4]},
    {label: "threshold", stroke: "#d62728", width: 2, spanGaps: true}];
  d.series.forEach(function (s, i) {
    data.push(column(s.points, function (p) { return p[1]; }));
    series.push({label: s.node_id, stroke: colours[i % colours.length], spanGaps: true});
  });
  var width = Math.min(box.clientWidth || 900, 1100);
  new uPlot({width: width, height: 300, series: series,
    scales: {y: {range: [0, 1.05]}}, axes: [{}, {label: "score"}]}, data, box);
})();

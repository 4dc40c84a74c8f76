"use strict";
// dory status page: polls /status.json every 2 s, keeps the last 5 minutes, updates the
// tables and draws per-topic rate sparklines. No external assets.
(function () {
  var PERIOD_MS = 2000, KEEP_MS = 5 * 60 * 1000, W = 160, H = 28;
  var history = []; // snapshots, oldest first

  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
  function label(t) { return t === "" ? "<i>(no topic)</i>" : esc(t); }
  function td(k, v) { return '<td class="n" data-k="' + k + '">' + esc(v) + "</td>"; }
  function point(p) { return p === null || p === undefined ? "none" : p; }
  function body(id, html) {
    var t = document.getElementById(id);
    if (t && t.tBodies.length) { t.tBodies[0].innerHTML = html; }
  }

  // Per-topic rate series (msgs/s) between consecutive snapshots: [{t, r, d, x}].
  function rates(topic) {
    var out = [], prev = null;
    history.forEach(function (s) {
      var cur = null;
      s.topics.forEach(function (t) { if (t.topic === topic) { cur = t; } });
      if (cur && prev && s.now_ms > prev.ms) {
        var dt = (s.now_ms - prev.ms) / 1000;
        out.push({
          t: s.now_ms,
          r: Math.max(0, cur.received - prev.t.received) / dt,
          d: Math.max(0, cur.delivered - prev.t.delivered) / dt,
          x: Math.max(0, cur.discarded - prev.t.discarded) / dt
        });
      }
      prev = cur ? { ms: s.now_ms, t: cur } : null;
    });
    return out;
  }

  // The x axis spans the history held (up to 5 minutes), so it fills as samples arrive.
  function spark(series, now) {
    var max = 1, span = Math.max(1, now - (history.length ? history[0].now_ms : now));
    series.forEach(function (p) { max = Math.max(max, p.r, p.d, p.x); });
    function line(key, cls) {
      var pts = series.map(function (p) {
        var x = 1 + (W - 2) * (1 - (now - p.t) / span), y = H - 2 - (p[key] / max) * (H - 4);
        return x.toFixed(1) + "," + y.toFixed(1);
      });
      return pts.length < 2 ? "" : '<polyline class="' + cls + '" fill="none" ' +
        'stroke="currentColor" stroke-width="1.5" points="' + pts.join(" ") + '"/>';
    }
    return '<svg width="' + W + '" height="' + H + '" viewBox="0 0 ' + W + " " + H +
      '"><rect width="' + W + '" height="' + H + '" fill="#fafafa" stroke="#ddd"/>' +
      '<g class="rcv">' + line("r", "rcv") + '</g><g class="dlv">' + line("d", "dlv") +
      '</g><g class="dsc">' + line("x", "dsc") + "</g><title>max " + max.toFixed(1) + " msg/s over " +
      Math.round(span / 1000) + " s</title></svg>";
  }

  function fmt(r) { return r < 10 ? r.toFixed(1) : Math.round(r).toString(); }

  function render(s) {
    var tot = document.querySelector('tr[data-row="totals"]');
    if (tot) {
      var v = {
        received: s.totals.received, delivered: s.totals.delivered,
        discarded: s.totals.discarded, in_flight: s.totals.in_flight,
        possible_duplicates: s.totals.possible_duplicates,
        pool_used: s.pool.used, pool_capacity: s.pool.capacity
      };
      tot.innerHTML = Object.keys(v).map(function (k) { return td(k, v[k]); }).join("");
    }
    var topics = "", queues = "";
    s.topics.forEach(function (t) {
      var series = rates(t.topic), last = series[series.length - 1];
      var head = '<tr data-topic="' + esc(t.topic) + '"><td>' + label(t.topic) + "</td>";
      topics += head + td("received", t.received) + td("delivered", t.delivered) +
        td("discarded", t.discarded) + td("in_flight", t.in_flight) +
        td("possible_duplicates", t.possible_duplicates) +
        '<td data-k="rates">' + (last ? '<span class="rcv">' + fmt(last.r) +
          '</span> / <span class="dlv">' + fmt(last.d) + '</span> / <span class="dsc">' +
          fmt(last.x) + "</span>" : "–") + "</td>" +
        '<td data-k="spark">' + spark(series, s.now_ms) + "</td></tr>";
      queues += head + td("new", t.new) + td("batch", t.batch) +
        td("send_wait", t.send_wait) + td("ack_wait", t.ack_wait) + "</tr>";
    });
    body("topics", topics);
    body("queues", queues);
    body("reasons", s.discards_by_reason.map(function (r) {
      return '<tr data-reason="' + esc(r.reason) + '"><td>' + esc(r.reason) + "</td>" +
        td("count", r.count) + "</tr>";
    }).join(""));
    body("report", s.discard_report.kinds.map(function (k) {
      return '<tr data-kind="' + esc(k[0]) + '"><td>' + esc(k[0]) + "</td>" +
        td("count", k[1]) + "</tr>";
    }).join(""));
    var cp = s.commit_points;
    if (cp) {
      body("commit_points", cp.topics.map(function (t) {
        return '<tr data-topic="' + esc(t.topic) + '"><td>' + label(t.topic) + "</td>" +
          td("commit_point", point(t.commit_point)) + td("unresolved", t.unresolved) +
          td("oldest_unacked_ms", t.oldest_unacked_ms) +
          td("late_arrivals", t.late_arrivals) + "</tr>";
      }).join("") + '<tr data-overall="1"><td><b>overall</b></td>' +
        td("commit_point", point(cp.overall)) + td("unresolved", cp.unresolved) +
        td("oldest_unacked_ms", cp.oldest_unacked_ms) + "<td></td></tr>");
    }
    var live = document.getElementById("live");
    live.textContent = "live: updated " + new Date(s.now_ms).toLocaleTimeString() +
      ", " + history.length + " samples";
    live.setAttribute("data-samples", history.length);
  }

  function poll() {
    fetch("/status.json", { cache: "no-store" })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
      .then(function (s) {
        history.push(s);
        while (history.length && history[0].now_ms < s.now_ms - KEEP_MS) { history.shift(); }
        render(s);
      })
      .catch(function (e) {
        document.getElementById("live").textContent = "live update failed: " + e.message;
      });
  }
  poll();
  setInterval(poll, PERIOD_MS);
})();

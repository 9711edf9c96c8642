/* BackWave admin: show every <time data-bw-time> in the browser's time zone, or in the server's
   (Django's current zone, which the page was rendered in), as the operator chooses; the choice
   is kept in localStorage. Times added later (a page that refreshes part of itself) are
   converted as they arrive. Plain JavaScript, no dependency. */
(function () {
  "use strict";
  var KEY = "backwave.timeZone";  // "browser" (default) or "server"
  var browserZone = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";

  function note() { return document.getElementById("bw-time-zone"); }
  function serverZone() { var n = note(); return (n && n.dataset.serverZone) || "UTC"; }
  function wanted() { try { return localStorage.getItem(KEY) || "browser"; } catch (e) { return "browser"; } }

  function parts(date, zone, precise) {
    var format = new Intl.DateTimeFormat("en-CA", {
      timeZone: zone, year: "numeric", month: "2-digit", day: "2-digit",
      hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23",
      fractionalSecondDigits: precise ? 3 : undefined
    });
    var out = {};
    format.formatToParts(date).forEach(function (p) { out[p.type] = p.value; });
    return out;
  }

  function show(element, zone) {
    if (!element.dataset.bwServerText) {  // remember what the server rendered, to switch back
      element.dataset.bwServerText = element.textContent;
      element.dataset.bwServerTitle = element.title;
    }
    if (zone === null) {
      element.textContent = element.dataset.bwServerText;
      element.title = element.dataset.bwServerTitle;
      return;
    }
    var date = new Date(element.getAttribute("datetime"));
    if (isNaN(date)) { return; }
    var precise = element.hasAttribute("data-bw-precise");
    var p = parts(date, zone, precise);
    var clock = p.hour + ":" + p.minute + ":" + p.second + (precise ? "." + p.fractionalSecond : "");
    element.textContent = p.month + "-" + p.day + " " + clock;
    element.title = p.year + "-" + p.month + "-" + p.day + " " + p.hour + ":" + p.minute + ":" + p.second + " " + zone
      + " (server: " + element.dataset.bwServerTitle + ")";
  }

  function apply(root) {
    var useBrowser = wanted() === "browser" && browserZone !== serverZone();
    var zone = useBrowser ? browserZone : null;
    (root || document).querySelectorAll("time[data-bw-time]").forEach(function (t) { show(t, zone); });
    var n = note();
    if (!n) { return; }
    var label = n.querySelector(".bw-zone-name"), toggle = n.querySelector("button");
    label.textContent = useBrowser ? browserZone + " (your browser's time zone)" : serverZone() + (
      browserZone === serverZone() ? " (the server's and your browser's time zone)" : " (the server's time zone)");
    n.dataset.shownZone = useBrowser ? browserZone : serverZone();
    if (toggle) {
      toggle.hidden = browserZone === serverZone();
      toggle.textContent = useBrowser ? "Show in " + serverZone() + " (server)" : "Show in " + browserZone + " (browser)";
    }
  }

  function start() {
    var n = note();
    var toggle = n && n.querySelector("button");
    if (toggle) {
      toggle.addEventListener("click", function () {
        try { localStorage.setItem(KEY, wanted() === "browser" ? "server" : "browser"); } catch (e) { /* private mode */ }
        apply(document);
      });
    }
    apply(document);
    new MutationObserver(function (changes) {
      changes.forEach(function (change) {
        change.addedNodes.forEach(function (node) { if (node.nodeType === 1) { apply(node.parentNode || node); } });
      });
    }).observe(document.body, { childList: true, subtree: true });
  }

  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", start); } else { start(); }
})();

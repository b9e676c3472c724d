// Live board: subscribe to the page's server-sent events (switchboard/live.py) and swap in the
// parts that changed. Each "swap" event names an element id and carries its new HTML (the same
// partial the page rendered); "announce" events go to the page's aria-live="polite" region.
(function () {
  "use strict";
  var root = document.querySelector("[data-live-url]");
  if (!root || !window.EventSource) return;

  var pending = {}; // target id -> html held back while the viewer is typing in it

  function busy(el) {
    var active = document.activeElement;
    if (active && el.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) return true;
    var fields = el.querySelectorAll("input[type=text], input:not([type]), textarea");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].value && fields[i].value !== fields[i].defaultValue) return true;
    }
    return false;
  }

  function swap(id, html) {
    var el = document.getElementById(id);
    if (!el) return;
    if (busy(el)) {
      pending[id] = html;
      return;
    }
    delete pending[id];
    var hadFocus = el.contains(document.activeElement) ? document.activeElement.id : null;
    var holder = document.createElement("div");
    holder.innerHTML = html.trim();
    var fresh = holder.firstElementChild;
    if (!fresh) return;
    el.replaceWith(fresh);
    if (window.htmx) window.htmx.process(fresh);
    if (hadFocus) {
      var again = document.getElementById(hadFocus);
      if (again) again.focus();
    }
  }

  function flush() {
    Object.keys(pending).forEach(function (id) {
      var el = document.getElementById(id);
      if (el && !busy(el)) swap(id, pending[id]);
    });
  }
  document.addEventListener("focusout", function () { setTimeout(flush, 0); });
  document.addEventListener("submit", function () { setTimeout(flush, 0); });

  var announcer = document.getElementById("announcer");
  var source = new EventSource(root.getAttribute("data-live-url"));
  source.addEventListener("swap", function (event) {
    var data = JSON.parse(event.data);
    swap(data.target, data.html);
  });
  source.addEventListener("announce", function (event) {
    var data = JSON.parse(event.data);
    if (announcer) {
      // Clear, then set, so a repeated sentence is announced again.
      announcer.textContent = "";
      setTimeout(function () { announcer.textContent = data.text; }, 50);
    }
  });
  root.setAttribute("data-live", "connecting");
  source.addEventListener("open", function () { root.setAttribute("data-live", "open"); });
  source.addEventListener("error", function () { root.setAttribute("data-live", "reconnecting"); });
})();

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

  function announce(event) {
    var data = JSON.parse(event.data);
    var announcer = document.getElementById("announcer");
    if (announcer) {
      // Clear, then set, so a repeated sentence is announced again.
      announcer.textContent = "";
      setTimeout(function () { announcer.textContent = data.text; }, 50);
    }
  }

  function status(value) {
    var el = document.querySelector("[data-live-url]");
    if (el) el.setAttribute("data-live", value);
  }

  var source = null;
  var url = null;

  function connect(next) {
    if (source) source.close();
    pending = {}; // held back for the filters being left
    url = next;
    var root = document.querySelector("[data-live-url]");
    if (root) root.setAttribute("data-live-url", next);
    source = new EventSource(next);
    source.addEventListener("swap", function (event) {
      var data = JSON.parse(event.data);
      swap(data.target, data.html);
    });
    source.addEventListener("announce", announce);
    status("connecting");
    source.addEventListener("open", function () { status("open"); });
    source.addEventListener("error", function () { status("reconnecting"); });
  }

  // What a stream URL subscribes to: everything but "at", the fingerprint it was rendered at.
  function subject(address) {
    var parsed = new URL(address, window.location.href);
    parsed.searchParams.delete("at");
    parsed.searchParams.sort();
    return parsed.pathname + "?" + parsed.searchParams.toString();
  }

  // The list names the stream of the filters it was rendered for. When an htmx swap (the filter
  // form, a pause) or a history restore (back) brings a list of other filters, follow it: the old
  // stream would push parts rendered for filters the page no longer shows.
  function follow() {
    var list = document.getElementById("sections");
    var next = list && list.getAttribute("data-live-follow");
    if (!next) {
      var root = document.querySelector("[data-live-url]");
      next = root && root.getAttribute("data-live-url");
    }
    if (!next) { // back to a page with no live board
      if (source) source.close();
      source = null;
      url = null;
    } else if (!url || subject(next) !== subject(url)) {
      connect(next);
    }
  }
  document.addEventListener("htmx:afterSettle", follow); // history restores settle too

  connect(root.getAttribute("data-live-url"));
})();

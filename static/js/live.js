// Live board: subscribe to the page's server-sent events (switchboard/live.py) and swap in the
// parts that changed. Each "swap" event names an element id and carries its new HTML (the same
// partial the page rendered); "announce" events go to the page's aria-live="polite" region.
(function () {
  "use strict";
  var root = document.querySelector("[data-live-url]");
  if (!root || !window.EventSource) return;

  var pending = {}; // target id -> {html, from} held back while the viewer is typing in it

  function busy(el) {
    var active = document.activeElement;
    if (active && el.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) return true;
    var fields = el.querySelectorAll("input[type=text], input:not([type]), textarea");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].value && fields[i].value !== fields[i].defaultValue) return true;
    }
    return false;
  }

  function swap(id, html, from) {
    var el = document.getElementById(id);
    if (!el) return;
    if (busy(el)) {
      pending[id] = { html: html, from: from };
      return;
    }
    delete pending[id];
    var hadFocus = el.contains(document.activeElement) ? document.activeElement.id : null;
    var holder = document.createElement("div");
    holder.innerHTML = html.trim();
    var fresh = holder.firstElementChild;
    if (!fresh) return;
    // What a pause or resume said ("Paused inbox: …") sits at the top of the list it answered
    // with; the stream's list, which follows within a second, carries none: keep it.
    var said = id === "sections" ? el.querySelector(":scope > .messages") : null;
    if (said && !fresh.querySelector(":scope > .messages")) fresh.insertBefore(said, fresh.firstChild);
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
      var held = pending[id];
      if (el && !busy(el)) {
        delete pending[id];
        receive(held.from, id, held.html);
      }
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

  // Parts of a page the stream does not send ask for themselves again when the stream shows a
  // change they sum up: the queue page's pause panel (the queue across the fleet) after a pause
  // or resume (a section's controls), sections coming or going (the list), or a section's
  // condition changing (an announcement). Each names its URL (data-live-refresh), which answers
  // htmx with that part alone; it is swapped in as the stream's parts are (held while the viewer
  // is typing in it). One round at a time; a change meanwhile asks for one more.
  var refreshing = false;
  var refreshAgain = false;
  function refresh() {
    var parts = document.querySelectorAll("[data-live-refresh]");
    if (!parts.length) return;
    if (refreshing) {
      refreshAgain = true;
      return;
    }
    refreshing = true;
    var left = parts.length;
    Array.prototype.forEach.call(parts, function (part) {
      var id = part.id;
      var from = url;
      window.fetch(part.getAttribute("data-live-refresh"), {
        headers: { "HX-Request": "true", "HX-Target": id },
        credentials: "same-origin",
      })
        .then(function (response) { return response.ok ? response.text() : ""; })
        .then(function (html) { if (html.trim()) receive(from, id, html); })
        .catch(function () {}) // the stream's own notices say when the server is out of reach
        .then(function () {
          left--;
          if (left > 0) return;
          refreshing = false;
          if (refreshAgain) {
            refreshAgain = false;
            refresh();
          }
        });
    });
  }

  function status(value) {
    var el = document.querySelector("[data-live-url]");
    if (el) el.setAttribute("data-live", value);
  }

  // The notices of a board that is not live (templates/queues/_live_notices.html): "lost" while
  // reconnecting takes longer than one retry (or the server answers an error while it is away),
  // "ended" once the stream is refused for good (a 204 when signed out, a 4xx).
  var LOST_AFTER_MS = 6000;
  var lostTimer = null;
  function notice(name, shown) {
    var el = document.querySelector("[data-live-" + name + "]");
    if (!el) return;
    // Its links lead back to the page as it is now (a filter may have moved the address since
    // the page was rendered).
    var here = window.location.pathname + window.location.search;
    var reload = el.querySelector("[data-live-here]");
    if (reload) reload.setAttribute("href", here);
    var signIn = el.querySelector("[data-live-sign-in]");
    if (signIn) {
      signIn.setAttribute("href", signIn.getAttribute("data-live-sign-in") + "?next=" + encodeURIComponent(here));
    }
    el.hidden = !shown;
  }
  function live() {
    clearTimeout(lostTimer);
    lostTimer = null;
    notice("lost", false);
  }

  var source = null;
  var url = null;

  // A new list from the stream while an htmx request that replaces the list is on its way (the
  // filter form, a pause, a resume): held until that request ends. Swapped in then, htmx would
  // put its answer into the list it meant to replace, no longer on the page: a search would show
  // the unfiltered cards under its own address, a pause would not show. Held, it is shown if the
  // request left the list in place (it failed), and dropped if the request replaced the list;
  // the stream is then subscribed again from the new list's fingerprint (resync), so whatever
  // changed since that list was rendered is sent.
  var listRequests = 0;
  var heldList = null; // {html, from}
  var resync = false;

  function forList(event) {
    var target = event.detail && event.detail.target;
    return !!target && target.id === "sections";
  }
  // Counted from beforeSend (a listener may still cancel the request at beforeRequest) to the
  // request's own loadend, which follows every sent request (loaded, failed, aborted, timed out)
  // after htmx has swapped its answer. Not to htmx:afterRequest: htmx fires it on the element that
  // sent the request, and a pause or resume form the stream replaced meanwhile (its queue's
  // controls changed) is off the page, so the event would never reach the document and every
  // later list would be held.
  document.addEventListener("htmx:beforeSend", function (event) {
    if (!forList(event)) return;
    var detail = event.detail;
    listRequests++;
    detail.xhr.addEventListener("loadend", function () { listEnded(detail.target); });
  });

  function listEnded(target) { // target: the list the request meant to replace
    listRequests--;
    if (listRequests === 0 && heldList) {
      var held = heldList;
      heldList = null;
      if (document.body.contains(target)) receive(held.from, "sections", held.html);
      else resync = true; // follow() subscribes again once the new list settles
    }
  }

  // A part sent by the stream ``from``: shown unless the list on the page is for other filters
  // (htmx swapped in another list, and follow() has not moved the stream yet: it does so once the
  // swap settles), or held while a request for a new list is on its way.
  function receive(from, id, html) {
    if (id === "sections" && listRequests > 0) {
      heldList = { html: html, from: from };
      return;
    }
    var list = document.getElementById("sections");
    var shown = list && list.getAttribute("data-live-follow");
    if (shown && subject(shown) !== subject(from)) return;
    swap(id, html, from);
  }

  function connect(next) {
    if (source) source.close();
    clearTimeout(lostTimer); // the new stream's own open or errors say whether it is live
    lostTimer = null;
    pending = {}; // held back for the filters being left
    heldList = null;
    resync = false;
    url = next;
    var root = document.querySelector("[data-live-url]");
    if (root) root.setAttribute("data-live-url", next);
    source = new EventSource(next);
    source.addEventListener("swap", function (event) {
      var data = JSON.parse(event.data);
      receive(next, data.target, data.html);
      if (data.target === "sections" || data.target.indexOf("controls-") === 0) refresh();
    });
    source.addEventListener("announce", function (event) {
      announce(event);
      refresh();
    });
    status("connecting");
    var opened = source;
    opened.addEventListener("open", function () {
      retryMs = 0;
      status("open");
      live();
    });
    opened.addEventListener("error", function () {
      if (opened !== source) return; // a stream this page has moved on from
      if (opened.readyState === EventSource.CLOSED) {
        refused(opened, next);
        return;
      }
      status("reconnecting");
      if (lostTimer === null) lostTimer = setTimeout(function () { notice("lost", true); }, LOST_AFTER_MS);
    });
  }

  // EventSource gives up on any answer but a stream: the 204 of a viewer signed out, and also a
  // proxy's 502 or the server's 503 while it restarts, after which the board stayed frozen
  // until reloaded by hand. Which it was is asked once (the stream's own address, dropped at
  // its head): signed out or refused, the board has ended; else the server is on its way back,
  // and the stream is opened again, waiting longer each time (1 s, doubling, at most 30 s).
  var retryMs = 0;
  var MAX_RETRY_MS = 30000;
  function refused(opened, address) {
    var stop = window.AbortController ? new AbortController() : null;
    window
      .fetch(address, {
        credentials: "same-origin",
        cache: "no-store",
        headers: { Accept: "text/event-stream" },
        signal: stop ? stop.signal : undefined,
      })
      .then(
        function (response) {
          if (stop) stop.abort(); // its head is the answer; the stream is not read
          return response.status;
        },
        function () { return 0; } // no answer at all
      )
      .then(function (code) {
        if (opened !== source) return;
        if (code === 204 || (code >= 400 && code < 500)) {
          status("closed");
          live();
          notice("ended", true);
          return;
        }
        status("reconnecting");
        notice("lost", true);
        retryMs = Math.min(retryMs ? retryMs * 2 : 1000, MAX_RETRY_MS);
        setTimeout(function () { if (opened === source) connect(address); }, retryMs);
      });
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
      live();
      source = null;
      url = null;
    } else if (!url || resync || subject(next) !== subject(url)) {
      connect(next);
    }
  }
  document.addEventListener("htmx:afterSettle", follow); // history restores settle too

  // What only a page that follows the stream may say ("Updates live."): hidden without script.
  document.querySelectorAll("[data-live-only]").forEach(function (el) {
    el.hidden = false;
  });
  connect(root.getAttribute("data-live-url"));
})();

// Small behaviours of the console. Everything here is an enhancement: every page works without it.
(function () {
  "use strict";

  // Coming back from the budget editor (/#edit-<identity>): put focus on the section's edit
  // control, so keyboard users continue where they left. Without JavaScript the fragment still
  // scrolls there and moves the sequential focus starting point to it.
  function focusFragment() {
    var id = decodeURIComponent(window.location.hash.slice(1));
    if (!id || id.indexOf("edit-") !== 0) return;
    var el = document.getElementById(id);
    if (el) el.focus();
  }

  // The todo drawer is a dialog for the keyboard: it takes focus when a link opens it, keeps it
  // while open (Tab and Shift+Tab go round inside it: at 390 px it covers the board, whose
  // controls are hidden behind it), and Escape or "Close" closes it, giving focus back to the
  // link that opened it. Without JavaScript there is no drawer: the link opens the todo's page,
  // and "Close" is a link back to the board.
  var opener = null; // the link that opened the drawer, and its todo's path should it be replaced
  var openerPath = "";

  function drawer() {
    return document.getElementById("drawer");
  }

  function isOpen(el) {
    return !!el && el.firstElementChild !== null;
  }

  function focusables(el) {
    var found = el.querySelectorAll(
      "a[href], button:not([disabled]), input:not([type=hidden]):not([disabled]), " +
        "select:not([disabled]), textarea:not([disabled]), [tabindex]:not([tabindex='-1'])"
    );
    return Array.prototype.filter.call(found, function (f) {
      return f.getClientRects().length > 0;
    });
  }

  // The link that opened the drawer, or the one showing the same todo now (the live board may
  // have replaced the cards meanwhile); else the page's main content.
  function returnTo() {
    if (opener && document.body.contains(opener)) return opener;
    var links = document.querySelectorAll("a[hx-target='#drawer']");
    for (var i = 0; i < links.length; i++) {
      if ((links[i].getAttribute("href") || "").split("?")[0] === openerPath) return links[i];
    }
    return document.getElementById("main");
  }

  function closeDrawer(el) {
    el.innerHTML = "";
    ["role", "aria-modal", "aria-labelledby", "aria-label", "tabindex"].forEach(function (name) {
      el.removeAttribute(name);
    });
    var back = returnTo();
    opener = null;
    if (back) back.focus();
  }

  document.addEventListener("click", function (event) {
    var close = event.target.closest && event.target.closest("[data-close-drawer]");
    if (!close) return;
    var el = drawer();
    if (el && el.contains(close)) {
      event.preventDefault();
      closeDrawer(el);
    }
  });

  document.addEventListener("htmx:beforeRequest", function (event) {
    var detail = event.detail || {};
    var el = drawer();
    if (!el || detail.target !== el || !detail.elt || el.contains(detail.elt)) return;
    opener = detail.elt;
    openerPath = (detail.elt.getAttribute("href") || "").split("?")[0];
  });

  document.addEventListener("keydown", function (event) {
    var el = drawer();
    if (!isOpen(el) || event.defaultPrevented) return;
    var active = document.activeElement;
    // Escape closes it from inside it (or with focus nowhere); at 1440 px the board beside it
    // keeps its own keys.
    if (event.key === "Escape" && (el.contains(active) || !active || active === document.body)) {
      event.preventDefault();
      closeDrawer(el);
      return;
    }
    if (event.key !== "Tab" || !el.contains(active)) return;
    var inside = focusables(el);
    if (!inside.length) {
      event.preventDefault();
      return;
    }
    var at = inside.indexOf(active);
    if (event.shiftKey && at <= 0) {
      event.preventDefault();
      inside[inside.length - 1].focus();
    } else if (!event.shiftKey && at === inside.length - 1) {
      event.preventDefault();
      inside[0].focus();
    }
  });

  // A drawer loaded by htmx is a dialog named by its todo's title, and takes focus, so keyboard
  // and screen reader users land in it.
  document.addEventListener("htmx:afterSwap", function (event) {
    var target = event.detail && event.detail.target;
    if (!target || target.id !== "drawer") return;
    target.setAttribute("role", "dialog");
    target.setAttribute("aria-modal", "true");
    var heading = target.querySelector("h2");
    if (heading && heading.id) {
      target.setAttribute("aria-labelledby", heading.id);
      target.removeAttribute("aria-label");
    } else {
      target.setAttribute("aria-label", "Todo details");
      target.removeAttribute("aria-labelledby");
    }
    var first = heading || target;
    first.setAttribute("tabindex", "-1");
    first.focus();
  });

  // A pause or resume made in a section replaces the list, the pressed button with it: focus
  // would drop to <body>, throwing a keyboard user to the top of the page. It goes to the same
  // section's control that now offers the opposite action (Resume after a pause, Pause after a
  // resume), as the budget editor returns focus to its section's edit control. A refused pause
  // swaps only its form, whose reason field takes focus (autofocus) instead.
  var pressedIn = null; // {controls: the section's controls' id, list: the list it replaces}
  document.addEventListener("htmx:beforeRequest", function (event) {
    var detail = event.detail || {};
    if (!detail.target || detail.target.id !== "sections" || !detail.elt) return;
    var controls = detail.elt.closest && detail.elt.closest(".qcontrols");
    pressedIn = controls ? { controls: controls.id, list: detail.target } : null;
  });

  // On the new list as soon as it is swapped in (not once it settles, 20 ms later: a list the
  // live board sends may replace it by then). Should the live board replace the section after,
  // it gives focus back to the control of the same id (static/js/live.js).
  document.addEventListener("htmx:afterSwap", function (event) {
    var list = event.target;
    if (!pressedIn || !list || list.id !== "sections" || list === pressedIn.list) return;
    var again = document.getElementById(pressedIn.controls);
    pressedIn = null;
    var control = again && again.querySelector(".resume-form button, .pause-form button");
    // The section no longer shown (the board's filters leave it out): the list, which starts
    // with what the pause or resume did.
    (control || list).focus();
  });

  // A request of the page's that came back refused without a swap (a 5xx: the database did not
  // answer; or a refusal made before any view ran, sent with HX-Reswap: none) or that got no
  // answer at all would otherwise leave the page as it was, without a word: a pause pressed
  // during an outage would look pressed. Said in the alert above the page (templates/base.html)
  // until dismissed or a later request succeeds.
  function requestFailed(text) {
    var el = document.getElementById("request-failed");
    if (!el) return;
    el.hidden = false;
    el.querySelector("[data-text]").textContent = text;
  }

  document.addEventListener("htmx:afterRequest", function (event) {
    var xhr = event.detail && event.detail.xhr;
    if (!xhr || !xhr.status) return; // no answer: htmx:sendError; cancelled: nothing to say
    var refused =
      xhr.status >= 500 || (xhr.status >= 400 && xhr.getResponseHeader("HX-Reswap") === "none");
    var el = document.getElementById("request-failed");
    if (!refused) {
      if (el && xhr.status < 400) el.hidden = true;
      return;
    }
    var said = new DOMParser().parseFromString(xhr.responseText || "", "text/html").body;
    var text = ((said && said.textContent) || "").replace(/\s+/g, " ").trim();
    requestFailed(text || "The server refused the request (HTTP " + xhr.status + ").");
  });

  document.addEventListener("htmx:sendError", function () {
    requestFailed(
      "The server did not answer, so what you asked for may not have been done. " +
        "Load the page again to see where things stand."
    );
  });

  document.addEventListener("click", function (event) {
    var dismiss = event.target.closest && event.target.closest("#request-failed [data-dismiss]");
    if (dismiss) dismiss.parentNode.hidden = true;
  });

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", focusFragment);
  } else {
    focusFragment();
  }
})();

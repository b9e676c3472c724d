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

  // The todo drawer: "Close" is a link back to the board; with the drawer open, it just closes it.
  document.addEventListener("click", function (event) {
    var close = event.target.closest && event.target.closest("[data-close-drawer]");
    if (!close) return;
    var drawer = document.getElementById("drawer");
    if (drawer && drawer.contains(close)) {
      event.preventDefault();
      drawer.innerHTML = "";
    }
  });

  // A drawer loaded by htmx takes focus, so keyboard and screen reader users land in it.
  document.addEventListener("htmx:afterSwap", function (event) {
    var target = event.detail && event.detail.target;
    if (target && target.id === "drawer") {
      var heading = target.querySelector("h2");
      if (heading) {
        heading.setAttribute("tabindex", "-1");
        heading.focus();
      }
    }
  });

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", focusFragment);
  } else {
    focusFragment();
  }
})();

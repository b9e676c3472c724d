// The admin's pages, after Django's own scripts. Django's two-list picker (SelectFilter2.js: a
// person's groups and permissions, a group's permissions) names the magnifier beside each filter
// box with aria-label on a bare <span>, which ARIA does not allow on an element without a role
// (axe: aria-prohibited-attr, serious), so a screen reader may drop the name. Give each the role
// of an image, which such a name is for. The picker builds itself on the window's load, from a
// script that ran before this deferred one and so registered its listener first: this one runs
// after it.
(function () {
  "use strict";
  window.addEventListener("load", function () {
    var icons = document.querySelectorAll(".selector .search-label-icon[aria-label]:not([role])");
    for (var i = 0; i < icons.length; i++) icons[i].setAttribute("role", "img");
  });
})();

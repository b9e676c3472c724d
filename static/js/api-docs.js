// The API docs page (templates/ninja/swagger.html), after Swagger UI's own scripts. Its request
// body editor, drawn when "Try it out" is pressed, is a <textarea> with no label (axe: label,
// critical), so a screen reader announces an unnamed edit box. Name each one as Swagger UI draws
// it; Swagger UI does not manage the attribute, so its later renders leave it in place.
(function () {
  "use strict";
  function nameEditors() {
    var editors = document.querySelectorAll("textarea.body-param__text:not([aria-label])");
    for (var i = 0; i < editors.length; i++) editors[i].setAttribute("aria-label", "Request body (JSON)");
  }
  new MutationObserver(nameEditors).observe(document.body, { childList: true, subtree: true });
})();

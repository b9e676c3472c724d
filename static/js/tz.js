// The viewer's time zone: a "tz" cookie from the browser's own zone, set once. The server shows
// times in it (UTC without it). A zone chosen on /prefs/tz sets the same cookie and wins, since
// this only fills the cookie when it is absent.
(function () {
  "use strict";
  if (/(?:^|;\s*)tz=/.test(document.cookie)) return;
  var zone;
  try {
    zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  } catch (e) {
    return;
  }
  if (!zone) return;
  // IANA names are cookie-safe as they are (letters, digits, "/", "_", "+", "-"); the server reads
  // the value as it is, so it is not URL-encoded. Anything else is not a zone: leave it.
  if (!/^[A-Za-z0-9_+\-\/]+$/.test(zone)) return;
  document.cookie = "tz=" + zone + "; path=/; max-age=31536000; samesite=lax";
  // First visit: this page was rendered in UTC; show it once more in the viewer's zone.
  if (document.body && document.body.dataset.viewerTz !== zone && /(?:^|;\s*)tz=/.test(document.cookie)) {
    window.location.reload();
  }
})();

// The dashboard's only script (served from 'self', so the Content-Security-Policy allows it).
// Everything works without it; it adds two conveniences.
"use strict";

document.addEventListener("DOMContentLoaded", function () {
  // 1. Pages showing deliveries still in flight reload themselves, so a delivery can be
  //    watched turning delivered or dead. Paused while the tab is hidden; bounded in count.
  var live = document.querySelector("[data-refresh-seconds]");
  var refreshesMax = 100;
  if (live) {
    var seconds = Math.max(1, parseInt(live.getAttribute("data-refresh-seconds"), 10) || 3);
    var done = parseInt(sessionStorage.getItem("refreshes:" + location.pathname) || "0", 10);
    if (done < refreshesMax) {
      setTimeout(function () {
        if (document.visibilityState === "visible") {
          sessionStorage.setItem("refreshes:" + location.pathname, String(done + 1));
          location.reload();
        }
      }, seconds * 1000);
    }
  } else {
    sessionStorage.removeItem("refreshes:" + location.pathname);
  }

  // 2. Copy buttons (for a revealed secret): shown only when the clipboard can be used.
  document.querySelectorAll("[data-copy]").forEach(function (button) {
    var target = document.querySelector(button.getAttribute("data-copy"));
    if (!target || !navigator.clipboard) { return; }
    button.hidden = false;
    button.addEventListener("click", function () {
      navigator.clipboard.writeText(target.textContent.trim()).then(function () {
        button.textContent = "Copied";
      }, function () {
        button.textContent = "Copy failed: select the text instead";
      });
    });
  });
});

// Live updates: the server renders every fragment (escaped) and decides every
// badge; this file only puts fragments where the server says. EventSource
// reconnects by itself and sends Last-Event-ID, from which the server resumes.
"use strict";
(function () {
  const main = document.querySelector("main[data-stream]");
  if (!main) return;
  const live = document.getElementById("live");
  const notice = document.getElementById("notice");
  let opens = 0;
  const source = new EventSource(main.dataset.stream);
  source.onopen = function () {
    opens += 1;
    document.body.dataset.opens = String(opens);
    live.textContent = "live";
    live.className = "on";
  };
  source.onerror = function () {
    live.textContent = "reconnecting…";
    live.className = "off";
  };
  source.onmessage = function (message) {
    const update = JSON.parse(message.data);
    for (const op of update.ops) {
      if (op.op === "append") {
        const target = document.getElementById(op.target);
        if (target) target.insertAdjacentHTML("beforeend", op.html);
      } else if (op.op === "replace") {
        const old = document.getElementById(op.id);
        if (old) old.outerHTML = op.html;
      }
    }
    notice.textContent = update.notice;
    document.body.dataset.lastEventId = message.lastEventId;
  };
})();

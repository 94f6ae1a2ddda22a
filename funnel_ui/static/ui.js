// Live updates: the server renders every fragment (escaped) and decides every
// badge; this file only puts fragments where the server says, and keeps the
// ages of the times shown current. EventSource reconnects by itself and sends
// Last-Event-ID, from which the server resumes.
"use strict";
(function () {
  function age(seconds) {
    const s = Math.max(0, Math.floor(seconds));
    const units = [["d", 86400], ["h", 3600], ["min", 60]];
    for (const [unit, size] of units) {
      if (s >= size) return Math.floor(s / size) + " " + unit;
    }
    return s + " s";
  }

  // Each .age[data-at] shows how long ago (or how soon) its moment is.
  function tick() {
    const now = Date.now() / 1000;
    for (const node of document.querySelectorAll(".age[data-at]")) {
      const at = Number(node.dataset.at);
      // A lease's expiry is still ahead: "in 9 min", not the "0 s" of a negative age.
      const text = age(Math.abs(now - at));
      const label = at > now ? "(in " + text + ")" : "(" + text + " ago)";
      if (node.textContent !== label) node.textContent = label;
    }
  }
  tick();
  setInterval(tick, 1000);

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
      } else if (op.op === "insert") {
        // A row of that id already shown moves: the server sends it where it belongs now.
        const target = document.getElementById(op.target);
        const holder = document.createElement("tbody");
        holder.innerHTML = op.html;
        const row = holder.firstElementChild;
        const shown = row && row.id ? document.getElementById(row.id) : null;
        if (shown) shown.remove();
        const before = op.before ? document.getElementById(op.before) : null;
        if (before) before.before(row);
        else if (target && op.at === "start") target.prepend(row);
        else if (target) target.append(row);
      } else if (op.op === "remove") {
        const old = document.getElementById(op.id);
        if (old) old.remove();
      }
    }
    notice.textContent = update.notice;
    document.body.dataset.lastEventId = message.lastEventId;
    document.body.dataset.messages = String(Number(document.body.dataset.messages || 0) + 1);
    tick();
  };
})();

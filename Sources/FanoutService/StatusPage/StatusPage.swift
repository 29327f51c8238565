/// The status page at `/`: one static HTML file with a little JavaScript, no build step, nothing fetched from
/// elsewhere. It holds no data itself: it polls `GET /v1/status` once a second with the server key, which it takes
/// from the address's fragment (`/#key=...`, never sent to the server, so never in a log) or from a form, and keeps
/// in the tab's session storage.
enum StatusPage {
    static let response = APIResponse(
        status: 200,
        headers: [
            ("content-type", "text/html; charset=utf-8"), ("cache-control", "no-store"),
            ("content-security-policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'"),
            ("referrer-policy", "no-referrer"),
        ],
        body: Array(html.utf8))

    static let html = #"""
        <!doctype html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <title>Fanout status</title>
        <style>
          body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
          table { border-collapse: collapse; width: 100%; }
          th, td { text-align: right; padding: 4px 8px; border-bottom: 1px solid #ddd; }
          th:first-child, td:first-child, td.kind, td.app, td.state { text-align: left; }
          .tiles { display: flex; gap: 2em; margin: 1em 0; }
          .tile b { display: block; font-size: 1.6em; }
          #error { color: #b00; }
          progress { width: 6em; }
        </style>
        </head>
        <body>
        <h1>Fanout <span id="workspace"></span></h1>
        <form id="login" hidden><label>Server key <input id="key" type="password" autocomplete="off"></label>
          <button>Show</button></form>
        <p id="error"></p>
        <div class="tiles">
          <div class="tile">Budget left <b id="budget-remaining">–</b> of <span id="budget-limit">–</span>/hour</div>
          <div class="tile">APNs connections <b id="apns-connections">–</b></div>
          <div class="tile">Sending now <b id="running-dispatches">–</b></div>
          <div class="tile">Send rate <b id="send-rate">–</b>/s</div>
        </div>
        <table>
          <thead><tr><th>Dispatch</th><th>Kind</th><th>App</th><th>State</th><th>Notifications</th><th>Delivered</th>
            <th>Unregistered</th><th>Rejected</th><th>Failed</th><th>Other</th><th>Progress</th><th>Rate/s</th><th>Seconds</th></tr></thead>
          <tbody id="dispatches"></tbody>
        </table>
        <script>
        "use strict";
        const fragment = new URLSearchParams(location.hash.slice(1));
        if (fragment.get("key")) {
          sessionStorage.setItem("fanout-key", fragment.get("key"));
          history.replaceState(null, "", location.pathname);
        }
        const $ = (id) => document.getElementById(id);
        $("login").addEventListener("submit", (event) => {
          event.preventDefault();
          sessionStorage.setItem("fanout-key", $("key").value);
          $("login").hidden = true;
          poll();
        });
        function cell(row, name, text) {
          const td = document.createElement("td");
          td.className = name;
          td.textContent = text;
          row.appendChild(td);
        }
        function render(status) {
          $("workspace").textContent = status.workspace;
          $("budget-remaining").textContent = status.budget.remaining;
          $("budget-limit").textContent = status.budget.limit_per_hour;
          $("apns-connections").textContent = status.apns_connections;
          $("running-dispatches").textContent = status.running_dispatches;
          const running = status.dispatches.filter((d) => d.state === "running");
          $("send-rate").textContent = running.reduce((sum, d) => sum + d.rate, 0);
          const body = $("dispatches");
          body.replaceChildren();
          for (const d of status.dispatches) {
            const row = document.createElement("tr");
            row.dataset.dispatch = d.id;
            cell(row, "id", d.id);
            cell(row, "kind", d.kind);
            cell(row, "app", d.app);
            cell(row, "state", d.state);
            cell(row, "notifications", d.notifications);
            cell(row, "delivered", d.delivered);
            cell(row, "unregistered", d.unregistered);
            cell(row, "rejected", d.rejected);
            cell(row, "failed", d.failed);
            cell(row, "other", d.expired + d.rate_limited + d.invalid + d.superseded);
            const progress = document.createElement("td");
            progress.className = "progress";
            if (d.state === "done") {
              progress.textContent = "done";
            } else if (d.expected > 0) {
              const bar = document.createElement("progress");
              bar.max = d.expected;
              bar.value = Math.min(d.notifications, d.expected);
              progress.appendChild(bar);
              progress.append(" " + Math.floor(100 * bar.value / d.expected) + "%");
            } else {
              progress.textContent = d.state;
            }
            row.appendChild(progress);
            cell(row, "rate", d.rate);
            cell(row, "seconds", d.seconds.toFixed(1));
            body.appendChild(row);
          }
        }
        async function poll() {
          const key = sessionStorage.getItem("fanout-key");
          if (!key) { $("login").hidden = false; return; }
          try {
            const response = await fetch("/v1/status", { headers: { "Authorization": "Bearer " + key } });
            if (response.status === 401 || response.status === 403) {
              sessionStorage.removeItem("fanout-key");
              $("error").textContent = "That key is not a server key of any workspace.";
              $("login").hidden = false;
              return;
            }
            if (!response.ok) throw new Error("HTTP " + response.status);
            render(await response.json());
            $("error").textContent = "";
            document.body.dataset.loaded = "true";
          } catch (error) {
            $("error").textContent = "Cannot reach the server: " + error.message;
          }
          setTimeout(poll, 1000);
        }
        poll();
        </script>
        </body>
        </html>
        """#
}

// conch status page: keeps the page live by fetching its main part (rendered by conchd) every
// two seconds. A token, when access control asks for one, is kept in this tab's sessionStorage
// and sent as an Authorization header, never in a URL.
(() => {
  "use strict";
  const KEY = "conch-token";
  const EVERY_MS = 2000;
  const main = document.getElementById("main");
  const stamp = document.getElementById("updated");
  const forget = document.getElementById("forget");
  if (!main || !main.dataset.part) return;
  const part = main.dataset.part;
  let timer = null;
  let refreshes = 0;

  const token = () => sessionStorage.getItem(KEY) || "";
  // Someone about to enter a token keeps the form they are in.
  const typing = () => {
    const active = document.activeElement;
    return active && active.id === "token" && main.contains(active);
  };

  async function refresh() {
    clearTimeout(timer);
    const headers = { Accept: "text/html" };
    const t = token();
    if (t) headers.Authorization = "Bearer " + t;
    try {
      const response = await fetch(part, { headers, cache: "no-store", credentials: "omit" });
      const html = await response.text();
      if (!typing()) {
        main.innerHTML = html;
        refreshes += 1;
        main.dataset.refreshed = String(refreshes);
      }
      stamp.textContent =
        (response.ok ? "live" : "HTTP " + response.status) +
        " · " + new Date().toLocaleTimeString();
      stamp.className = "stamp " + (response.ok ? "ok" : "bad");
    } catch (e) {
      stamp.textContent = "node unreachable · " + new Date().toLocaleTimeString();
      stamp.className = "stamp bad";
    }
    forget.hidden = !token();
    timer = setTimeout(refresh, EVERY_MS);
  }

  document.addEventListener("submit", (event) => {
    if (event.target.id !== "token-form") return;
    event.preventDefault();
    const input = event.target.elements.token;
    const value = input.value.trim();
    if (value) sessionStorage.setItem(KEY, value);
    input.value = "";
    input.blur();
    refresh();
  });
  forget.addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    refresh();
  });
  refresh();
})();

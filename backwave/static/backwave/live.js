/* BackWave's live admin pages.
 *
 * A page opts in with one element carrying data-bw-live="<seconds>" (the switch, rendered by the
 * {% backwave_live %} tag) and marks what may change with data-bw-live-region on elements that
 * have an id. Every <seconds> the page fetches its own URL and swaps each region for the fresh
 * page's element of the same id; nothing else on the page is touched, so a changelist's filters,
 * search box and action bar stay as the operator left them.
 *
 * It never refreshes while the operator is busy with the page: rows selected (a changelist's
 * action checkboxes, the Queues page's), a form field focused, the tab hidden, or paused by hand.
 * After a swap, Django's admin actions script is bound to the new rows, so "select all" and the
 * "n of m selected" counter keep working.
 */
"use strict";
{
    const SELECTED = "input.action-select:checked, #action-toggle:checked, input[name=_selected_action]:checked";
    // Fields an operator types into or picks from (a checkbox only counts while it is checked).
    const EDITING = "input:not([type=checkbox]):not([type=radio]):not([type=button]):not([type=submit]), select, textarea";

    function start(root) {
        const seconds = Number(root.dataset.bwLive);
        if (!(seconds > 0)) {
            return;
        }
        const status = root.querySelector("[data-bw-live-status]");
        const toggle = root.querySelector("[data-bw-live-toggle]");
        let pausedByHand = false;
        let inFlight = false;

        function say(text) {
            status.textContent = text;
        }

        function busy() {
            if (pausedByHand) return "paused";
            if (document.hidden) return "paused while the tab is hidden";
            if (document.querySelector(SELECTED)) return "paused while rows are selected";
            const focused = document.activeElement;
            if (focused && focused.matches(EDITING)) {
                return "paused while you edit";
            }
            return "";
        }

        async function refresh() {
            const why = busy();
            if (why) {
                root.dataset.bwLiveSkipped = String(Number(root.dataset.bwLiveSkipped || 0) + 1);
                root.dataset.bwLiveState = "paused";
                say(why);
                return;
            }
            if (inFlight) return;
            inFlight = true;
            try {
                const response = await fetch(window.location.href, {
                    credentials: "same-origin",
                    headers: {"X-Requested-With": "backwave-live"},
                });
                if (!response.ok) throw new Error(`HTTP ${response.status}`);
                const page = new DOMParser().parseFromString(await response.text(), "text/html");
                if (busy()) return; // the operator started selecting while the page was on its way
                let swapped = 0;
                document.querySelectorAll("[data-bw-live-region][id]").forEach((old) => {
                    const fresh = page.getElementById(old.id);
                    if (fresh) {
                        old.replaceWith(document.importNode(fresh, true));
                        swapped += 1;
                    }
                });
                if (!swapped) throw new Error("the page has changed (signed out?): reload it");
                const rows = document.querySelectorAll("tr input.action-select");
                if (rows.length && typeof window.Actions === "function") {
                    window.Actions(rows);
                }
                root.dataset.bwLiveRefreshes = String(Number(root.dataset.bwLiveRefreshes || 0) + 1);
                root.dataset.bwLiveState = "live";
                say(`updated ${new Date().toLocaleTimeString()}`);
            } catch (error) {
                root.dataset.bwLiveState = "failing";
                say(`refresh failed (${error.message}); trying again`);
            } finally {
                inFlight = false;
            }
        }

        toggle.addEventListener("click", () => {
            pausedByHand = !pausedByHand;
            toggle.textContent = pausedByHand ? "Resume" : "Pause";
            toggle.setAttribute("aria-pressed", String(pausedByHand));
            if (pausedByHand) {
                root.dataset.bwLiveState = "paused";
                say("paused");
            } else {
                refresh();
            }
        });
        root.dataset.bwLiveState = "live";
        say(`every ${seconds} s`);
        window.setInterval(refresh, seconds * 1000);
    }

    function ready(fn) {
        if (document.readyState !== "loading") fn();
        else document.addEventListener("DOMContentLoaded", fn);
    }

    ready(() => document.querySelectorAll("[data-bw-live]").forEach(start));
}

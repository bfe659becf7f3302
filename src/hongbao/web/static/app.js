// hongbao web page: sign in, wallet, send, open a packet, live claims, my red packets
// (received and sent, by year), operator dashboard.
// Plain JavaScript, no framework, no network access except this service's own API.
// Money is handled as integer fen throughout; the yuan text a person types is parsed
// as digits (never through a floating-point number).
"use strict";
(function () {
  var STRINGS = window.HB_STRINGS;
  var DEMO = (document.querySelector('meta[name="hongbao-demo"]') || {}).content === "1";
  var AUTH_KEY = "hongbao.auth";
  var ADMIN_KEY = "hongbao.admin";
  var LANG_KEY = "hongbao.lang";
  var POLL_MS = 2000;
  var RETRY_MS = 1000; // before a live stream is opened again
  var MAX_AUDIENCE = 1000;
  var MAX_START_AHEAD_MS = 7 * 86400 * 1000;
  var USER_ID = /^[A-Za-z0-9_.:@-]{1,64}$/;
  // a demo sign-in's name, as POST /demo/token takes it (the user is demo-<name>)
  var DEMO_NAME = /^[A-Za-z0-9_.@-]{1,32}$/;
  // refusals that pass by themselves or that the person can fix: shown for a moment
  var TRANSIENT = ["wrong_passphrase", "too_many_attempts", "rate_limited", "not_started"];

  var $ = function (id) { return document.getElementById(id); };
  var lang = localStorage.getItem(LANG_KEY) ||
    ((navigator.language || "zh").toLowerCase().indexOf("zh") === 0 ? "zh" : "en");
  var auth = load(AUTH_KEY);
  var adminToken = (load(ADMIN_KEY) || {}).token || null;
  var current = null; // teardown of the current screen (live updates, timers)

  // -- words ----------------------------------------------------------------------------

  function t(key, params) {
    var s = (STRINGS[lang] && STRINGS[lang][key]) || STRINGS.en[key] || key;
    return s.replace(/\{(\w+)\}/g, function (_, k) {
      return params && params[k] !== undefined ? String(params[k]) : "";
    });
  }

  function applyLang() {
    document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
    document.querySelectorAll("[data-i18n]").forEach(function (el) {
      el.textContent = t(el.getAttribute("data-i18n"));
    });
    var button = $("lang");
    button.textContent = t("langSwitch");
    button.lang = lang === "zh" ? "en" : "zh-CN";
    document.title = t("brand") + " · hongbao";
    if (rerender) rerender();
  }
  var rerender = null; // redraws language-dependent dynamic text of the current screen

  // -- money ----------------------------------------------------------------------------

  /** "12.3" -> 1230 (fen); null unless digits with at most two decimals. */
  function parseYuan(text) {
    var m = /^\s*¥?\s*(\d{1,10})(?:\.(\d{0,2}))?\s*$/.exec(text || "");
    if (!m) return null;
    var whole = m[1].replace(/^0+(?=\d)/, "");
    var cents = ((m[2] || "") + "00").slice(0, 2);
    var fen = parseInt(whole + cents, 10); // an integer string: exact below 2^53
    return Number.isSafeInteger(fen) ? fen : null;
  }

  function yuan(fen) {
    var negative = fen < 0;
    fen = Math.abs(fen);
    var cents = String(fen % 100);
    return (negative ? "-" : "") + "¥" + Math.floor(fen / 100) + "." + (cents.length < 2 ? "0" + cents : cents);
  }

  window.hongbaoMoney = { parseYuan: parseYuan, yuan: yuan }; // for the tests

  // -- storage, tokens ------------------------------------------------------------------

  function load(key) {
    try { return JSON.parse(localStorage.getItem(key) || "null"); } catch (e) { return null; }
  }

  function save(key, value) {
    if (value === null) localStorage.removeItem(key);
    else localStorage.setItem(key, JSON.stringify(value));
  }

  /**
   * What a JWT says of its user ({sub, exp, adm}: adm when it has the hongbao:admin role,
   * in its roles or scope claim), or null. The server checks the signature.
   */
  function tokenClaims(token) {
    var parts = String(token || "").trim().split(".");
    if (parts.length !== 3) return null;
    try {
      var b64 = parts[1].replace(/-/g, "+").replace(/_/g, "/");
      while (b64.length % 4) b64 += "=";
      var data = JSON.parse(atob(b64));
      if (typeof data.sub !== "string" || typeof data.exp !== "number") return null;
      if (data.exp * 1000 <= Date.now()) return null;
      var roles = Array.isArray(data.roles) ? data.roles : String(data.roles || "").split(" ");
      roles = roles.concat(String(data.scope || "").split(" "));
      return { sub: data.sub, exp: data.exp, adm: roles.indexOf("hongbao:admin") >= 0 };
    } catch (e) { return null; }
  }

  function randomKey() {
    var bytes = new Uint8Array(16);
    crypto.getRandomValues(bytes);
    return Array.prototype.map.call(bytes, function (b) { return (b + 256).toString(16).slice(1); }).join("");
  }

  // -- HTTP -----------------------------------------------------------------------------

  /** A user id from what a person typed: in demo mode, "bob" stands for demo-bob. */
  function userIdOf(name) {
    return DEMO && name.indexOf("demo-") !== 0 ? "demo-" + name : name;
  }

  /** "01:05", "1:02:03": a countdown's time left. */
  function clock(ms) {
    var s = Math.max(0, Math.ceil(ms / 1000));
    var two = function (n) { return (n < 10 ? "0" : "") + n; };
    var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
    return (h ? h + ":" + two(m) : two(m)) + ":" + two(s % 60);
  }

  /** JSON from the API; throws {status, code, field} (a problem document) on failure. */
  function api(method, path, body, options) {
    options = options || {};
    var headers = { "Accept": "application/json" };
    var token = options.token || (auth && auth.token);
    if (token) headers["Authorization"] = "Bearer " + token;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (options.idempotencyKey) headers["Idempotency-Key"] = options.idempotencyKey;
    return fetch(path, {
      method: method, headers: headers, cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body)
    }).then(function (response) {
      return response.text().then(function (text) {
        var data = null;
        try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
        if (response.ok) return data;
        var problem = data && typeof data === "object" ? data : {};
        throw { status: response.status, code: problem.code || null, field: problem.field || null };
      });
    }, function () {
      throw { status: 0, code: "network", field: null };
    });
  }

  /** A problem in words, in the current language; never the raw response. */
  function describe(err) {
    if (!err || typeof err !== "object" || err.status === undefined) return t("err.generic", { status: "?" });
    var code = err.code;
    if (err.status === 0) return t("err.network");
    if (err.status === 429 && code && code !== "rate_limited" && STRINGS.en["err." + code]) return t("err." + code);
    if (err.status === 429 || code === "too_many_requests" || code === "rate_limited") return t("err.too_many_requests");
    if (code === "invalid_request" || err.status === 422) {
      var field = err.field && STRINGS[lang]["field." + err.field] ? t("field." + err.field) : t("field.body");
      return t("err.invalid_request", { field: field });
    }
    if (code && STRINGS.en["err." + code]) return t("err." + code);
    if (err.status === 401) return t("err.unauthorized");
    if (err.status === 403) return t("err.forbidden");
    if (err.status === 503) return t("err.storage_unavailable");
    return t("err.generic", { status: err.status });
  }

  function showError(err) {
    var box = $("error");
    if (!err) { box.hidden = true; box.textContent = ""; return; }
    if (err.status === 401 && auth) signOut(); // back to the sign-in screen, then say why
    box.textContent = typeof err === "string" ? err : describe(err);
    box.hidden = false;
  }

  function notify(text) {
    var box = $("notice");
    box.textContent = text || "";
    box.hidden = !text;
  }

  // -- routing --------------------------------------------------------------------------

  function route() {
    var hash = /^#\/p\/([^/?#]+)$/.exec(location.hash);
    if (hash) return { name: "packet", id: decodeURIComponent(hash[1]) };
    var path = /^\/p\/([^/?#]+)$/.exec(location.pathname);
    if (path) return { name: "packet", id: decodeURIComponent(path[1]) };
    if (location.pathname === "/admin") return { name: "admin" };
    if (location.pathname === "/me") return { name: "history" };
    return { name: "home" };
  }

  function go(path) {
    history.pushState(null, "", path);
    render();
  }

  function show(view) {
    ["signin", "home", "packet", "history", "admin"].forEach(function (name) {
      $("view-" + name).hidden = name !== view;
    });
  }

  function render() {
    if (current) { current(); current = null; }
    rerender = null;
    showError(null);
    notify("");
    var r = route();
    updateWho();
    if (r.name === "admin") return renderAdmin();
    if (!auth) return renderSignIn();
    if (r.name === "packet") return renderPacket(r.id);
    if (r.name === "history") return renderHistory();
    return renderHome();
  }

  function updateWho() {
    $("who").textContent = auth ? auth.user : "";
    $("signout").hidden = !auth;
  }

  function signOut() {
    auth = null;
    save(AUTH_KEY, null);
    render();
  }

  // -- sign in --------------------------------------------------------------------------

  function renderSignIn() {
    show("signin");
    $("demo-form").hidden = !DEMO;
    $("token-form").hidden = DEMO;
    (DEMO ? $("name") : $("token")).focus();
  }

  function signedIn(token, user) {
    auth = { token: token, user: user };
    save(AUTH_KEY, auth);
    render();
  }

  $("demo-form").addEventListener("submit", function (event) {
    event.preventDefault();
    var name = $("name").value.trim();
    if (!DEMO_NAME.test(name)) { showError(t("signin.badName")); $("name").focus(); return; }
    var button = event.submitter || this.querySelector("button");
    button.disabled = true;
    api("POST", "/demo/token", { name: name }).then(function (data) {
      signedIn(data.token, data.user_id);
    }, showError).then(function () { button.disabled = false; });
  });

  $("token-form").addEventListener("submit", function (event) {
    event.preventDefault();
    var token = $("token").value.trim();
    var claims = tokenClaims(token);
    if (!claims) { showError(t("signin.badToken")); return; }
    api("GET", "/v1/wallets/" + encodeURIComponent(claims.sub), undefined, { token: token }).then(function () {
      signedIn(token, claims.sub);
    }, showError);
  });

  $("signout").addEventListener("click", function () { signOut(); });

  // -- wallet and send ------------------------------------------------------------------

  function renderHome() {
    show("home");
    if (!$("greeting").value) $("greeting").placeholder = t("send.defaultGreeting");
    rerender = function () { $("greeting").placeholder = t("send.defaultGreeting"); };
    refreshWallet();
  }

  function refreshWallet() {
    if (!auth) return;
    api("GET", "/v1/wallets/" + encodeURIComponent(auth.user)).then(function (wallet) {
      $("balance").textContent = yuan(wallet.balance);
      $("balance").setAttribute("data-fen", String(wallet.balance));
    }, showError);
  }

  var sendKey = null; // one Idempotency-Key per distinct packet the person sends
  $("send-form").addEventListener("input", function () { sendKey = null; });
  $("send-form").addEventListener("change", function () {
    var who = this.querySelector('input[name="who"]:checked').value;
    $("group-box").hidden = who !== "group";
    $("one-box").hidden = who !== "one";
  });

  /** The rules of the send form, added to `body`; false (and the reason shown) if bad. */
  function addRules(form, body) {
    var who = form.querySelector('input[name="who"]:checked').value;
    if (who === "group") {
      var members = $("members").value.split(/[\s,，、;]+/).filter(Boolean).map(userIdOf);
      var distinct = members.filter(function (m, i) { return members.indexOf(m) === i; });
      if (!distinct.length || distinct.length > MAX_AUDIENCE || body.count > distinct.length ||
          !distinct.every(function (m) { return USER_ID.test(m); })) {
        showError(t("send.badMembers")); $("members").focus(); return false;
      }
      body.audience = distinct;
    } else if (who === "one") {
      var one = userIdOf($("one-user").value.trim());
      if (!USER_ID.test(one) || body.count !== 1) { showError(t("send.badOne")); $("one-user").focus(); return false; }
      body.audience = [one];
    }
    var phrase = $("passphrase").value.trim();
    if (phrase) body.passphrase = phrase;
    var start = $("starts-at").value;
    if (start) {
      var when = new Date(start); // the person's local time
      if (isNaN(when.getTime()) || when.getTime() - Date.now() > MAX_START_AHEAD_MS) {
        showError(t("send.badStart")); $("starts-at").focus(); return false;
      }
      body.starts_at = when.toISOString();
    }
    return true;
  }

  $("send-form").addEventListener("submit", function (event) {
    event.preventDefault();
    showError(null);
    var fen = parseYuan($("amount").value);
    if (fen === null || fen < 1) { showError(t("send.badAmount")); $("amount").focus(); return; }
    var countText = $("count").value.trim();
    if (!/^\d{1,6}$/.test(countText) || parseInt(countText, 10) < 1) { showError(t("send.badCount")); $("count").focus(); return; }
    var count = parseInt(countText, 10);
    if (count > fen) { showError(t("send.tooSmall")); $("count").focus(); return; }
    var mode = this.querySelector('input[name="mode"]:checked').value;
    var greeting = $("greeting").value.trim() || t("send.defaultGreeting");
    var body = { total_amount: fen, count: count, mode: mode, greeting: greeting };
    if (!addRules(this, body)) return;
    sendKey = sendKey || randomKey();
    var button = $("send");
    button.disabled = true;
    api("POST", "/v1/packets", body, { idempotencyKey: sendKey }).then(function (packet) {
      sendKey = null;
      $("amount").value = "";
      $("greeting").value = "";
      ["members", "one-user", "passphrase", "starts-at"].forEach(function (id) { $(id).value = ""; });
      go("/p/" + encodeURIComponent(packet.id));
    }, showError).then(function () { button.disabled = false; });
  });

  // -- a packet -------------------------------------------------------------------------

  function renderPacket(id) {
    show("packet");
    var state = { packet: null, claims: null, mine: null, outcome: null, live: "", closed: false };
    var source = null, timer = null, errors = 0, ticker = null;
    current = function () {
      state.closed = true;
      if (source) source.close();
      if (timer) clearInterval(timer);
      if (ticker) clearInterval(ticker);
    };
    $("open").hidden = true;
    $("open").disabled = false;
    $("for-you").hidden = true;
    $("countdown").hidden = true;
    $("phrase-box").hidden = true;
    $("phrase").value = "";
    $("cancel").hidden = true;
    $("mine").hidden = true;
    $("packet-outcome").hidden = true;
    $("share").hidden = true;
    $("claims").textContent = "";
    $("summary").textContent = "";
    $("packet-from").textContent = "";
    $("packet-title").textContent = "";
    $("live").textContent = "";

    function draw() {
      var p = state.packet, c = state.claims;
      if (!p) return;
      $("packet-from").textContent = t("packet.from", { user: p.sender_id });
      $("packet-title").textContent = p.greeting || t("send.defaultGreeting");
      var mine = state.mine;
      if (!mine && c) {
        c.claims.forEach(function (x) { if (x.user_id === auth.user) mine = x; });
        state.mine = mine;
      }
      // the button shows while the packet is open to this person; once it is finished,
      // someone who got nothing sees why (the sender a neutral line)
      var sender = p.sender_id === auth.user;
      // a refusal the person can fix or wait out leaves the button (and passphrase box)
      var retry = !state.outcome || TRANSIENT.indexOf(state.outcome.code) >= 0;
      var open = !mine && retry && p.status === "active";
      $("open").hidden = !open;
      $("mine").hidden = !mine;
      // the rules as the grabber sees them: for whom, a passphrase to type, a countdown
      var tag = "";
      if (p.audience_size && p.for_you) tag = p.audience_size === 1 ? t("packet.forYou") : t("packet.forGroup", { n: p.audience_size });
      else if (p.audience_size && !sender) tag = t("packet.notForYou");
      $("for-you").textContent = tag;
      $("for-you").hidden = !tag;
      $("phrase-box").hidden = !(open && p.passphrase_required);
      var wait = p.starts_at && p.status === "active" ? Date.parse(p.starts_at) - Date.now() : 0;
      $("countdown").hidden = !(wait > 0);
      $("countdown").textContent = wait > 0 ? t("packet.opensIn", { time: clock(wait) }) : "";
      $("open").disabled = wait > 0;
      if (wait > 0 && !ticker) ticker = setInterval(draw, 1000);
      if (!(wait > 0) && ticker) { clearInterval(ticker); ticker = null; }
      $("cancel").hidden = !(sender && p.status === "active");
      if (mine) {
        $("mine-amount").textContent = yuan(mine.amount);
        $("mine-amount").setAttribute("data-fen", String(mine.amount));
      }
      var outcome = $("packet-outcome");
      var finished = "";
      if (p.status === "exhausted") finished = sender ? t("packet.statusExhausted") : t("err.packet_exhausted");
      else if (p.status === "expired") {
        finished = sender ? t("packet.statusExpired") : t("err.packet_expired");
        if (p.refunded_amount) finished += " " + t("packet.refunded", { amount: yuan(p.refunded_amount) });
        else if (p.remaining_amount) finished += " " + t("packet.refunding", { amount: yuan(p.remaining_amount) });
      } else if (p.status === "cancelled") {
        finished = sender ? t("packet.cancelled") : t("err.packet_cancelled");
        if (p.refunded_amount) finished += " " + t("packet.refunded", { amount: yuan(p.refunded_amount) });
      }
      outcome.textContent = state.outcome ? describe(state.outcome) : (mine ? "" : finished);
      outcome.hidden = !outcome.textContent;
      if (sender) {
        $("share").hidden = false;
        $("share-link").value = location.origin + "/p/" + encodeURIComponent(p.id);
        var rules = [];
        if (p.audience) rules.push(t("packet.rulesAudience", { users: p.audience.join(", ") }));
        if (p.passphrase_required) rules.push(t("packet.rulesPhrase"));
        if (p.starts_at) rules.push(t("packet.rulesStart", { time: new Date(p.starts_at).toLocaleString(lang === "zh" ? "zh-CN" : "en-GB") }));
        $("rules-summary").textContent = rules.join(" · ");
      }
      $("summary").textContent = t("packet.summary", {
        taken: p.count - p.remaining_count, count: p.count,
        claimed: yuan(p.total_amount - p.remaining_amount), total: yuan(p.total_amount)
      });
      drawClaims(c);
      $("live").textContent = state.live ? t(state.live) : "";
    }
    rerender = draw;

    function drawClaims(c) {
      var list = $("claims");
      list.textContent = "";
      if (!c || !c.claims.length) {
        var empty = document.createElement("li");
        empty.className = "empty";
        empty.textContent = t("packet.none");
        list.appendChild(empty);
        return;
      }
      c.claims.forEach(function (x) {
        var li = document.createElement("li");
        li.setAttribute("data-user", x.user_id);
        li.setAttribute("data-fen", String(x.amount));
        var who = document.createElement("span");
        who.className = "claim-who";
        who.textContent = x.user_id + (x.user_id === auth.user ? t("packet.you") : "");
        var time = document.createElement("time");
        time.dateTime = x.claimed_at;
        time.textContent = new Date(x.claimed_at).toLocaleTimeString(lang === "zh" ? "zh-CN" : "en-GB");
        who.appendChild(document.createElement("br"));
        who.appendChild(time);
        var amount = document.createElement("span");
        amount.className = "claim-amount";
        amount.textContent = yuan(x.amount);
        li.appendChild(who);
        li.appendChild(amount);
        if (c.best_luck === x.user_id) {
          li.className = "best";
          var badge = document.createElement("span");
          badge.className = "badge";
          badge.setAttribute("data-testid", "best-luck");
          badge.textContent = "👑 " + t("packet.bestLuck");
          li.appendChild(badge);
        }
        list.appendChild(li);
      });
    }

    function update(data) {
      if (state.closed) return;
      var before = state.packet;
      // the live events are the same for every watcher: what is the caller's own (whether
      // the audience names them, the audience itself for the sender) stays from the API
      if (before && data.packet.for_you === undefined) data.packet.for_you = before.for_you;
      if (before && data.packet.audience === undefined) data.packet.audience = before.audience;
      state.packet = data.packet;
      state.claims = data.claims;
      draw();
      var p = data.packet;
      // final: every share taken (best luck known), or expired with its leftover refunded
      var refunded = p.refunded_amount || !p.remaining_amount;
      var closed = p.status === "expired" || p.status === "cancelled";
      if (p.status !== "active" && (closed ? refunded : data.claims.best_luck)) {
        stopLive();
      }
    }

    function stopLive() {
      if (source) { source.close(); source = null; }
      if (timer) { clearInterval(timer); timer = null; }
      state.live = "packet.final";
      draw();
    }

    function fetchState() {
      var base = "/v1/packets/" + encodeURIComponent(id);
      return Promise.all([api("GET", base), api("GET", base + "/claims")]).then(function (r) {
        update({ packet: r[0], claims: r[1] });
      });
    }

    function startPolling() {
      if (source) { source.close(); source = null; }
      if (timer || state.closed) return;
      state.live = "packet.polling";
      draw();
      timer = setInterval(function () { fetchState().catch(function () {}); }, POLL_MS);
    }

    /**
     * The live stream. An EventSource cannot send the token, and a token never goes in a
     * URL: each connection gets a one-minute ticket for this packet first. A stream ends
     * every few minutes; it is then opened again with a new ticket.
     */
    function startLive() {
      if (!window.EventSource) return startPolling();
      var base = "/v1/packets/" + encodeURIComponent(id);
      api("POST", base + "/events/ticket").then(function (granted) {
        if (state.closed || timer || source || state.live === "packet.final") return;
        source = new EventSource(base + "/events?ticket=" + encodeURIComponent(granted.ticket));
        source.addEventListener("packet", function (event) {
          errors = 0;
          if (state.live !== "packet.live") { state.live = "packet.live"; }
          update(JSON.parse(event.data));
        });
        source.onerror = function () {
          errors += 1;
          if (source) { source.close(); source = null; }
          // failing repeatedly: poll instead; else reconnect with a fresh ticket
          if (errors >= 3) startPolling();
          else if (!state.closed) setTimeout(startLive, RETRY_MS);
        };
      }, function () { startPolling(); });
    }

    $("open").onclick = function () {
      var button = $("open");
      var phrase = $("phrase").value.trim();
      if (state.packet && state.packet.passphrase_required && !phrase) { $("phrase").focus(); return; }
      button.disabled = true;
      button.classList.add("spinning");
      var body = phrase ? { passphrase: phrase } : undefined;
      api("POST", "/v1/packets/" + encodeURIComponent(id) + "/grab", body).then(function (result) {
        state.mine = { user_id: result.user_id, amount: result.amount, seq: result.seq };
        draw();
        return fetchState();
      }, function (err) {
        if ([403, 404, 409, 410, 429].indexOf(err.status) >= 0 && err.code !== "forbidden") {
          state.outcome = err;
          draw();
          if (err.status === 429 || TRANSIENT.indexOf(err.code) >= 0) {
            setTimeout(function () { state.outcome = null; draw(); }, 3000);
          }
        } else {
          showError(err);
        }
      }).then(function () {
        button.disabled = false;
        button.classList.remove("spinning");
        draw();
      });
    };

    $("cancel").onclick = function () {
      if (!window.confirm(t("packet.cancel") + "?")) return;
      var button = $("cancel");
      button.disabled = true;
      api("POST", "/v1/packets/" + encodeURIComponent(id) + "/cancel").then(function (packet) {
        state.packet = packet;
        draw();
        return fetchState();
      }, showError).then(function () { button.disabled = false; });
    };

    fetchState().then(function () {
      if (state.closed) return;
      if (state.packet.status === "active" || !state.claims.best_luck) startLive();
      else stopLive();
    }, function (err) {
      if (err.status === 404) {
        state.outcome = err;
        $("packet-outcome").textContent = describe(err);
        $("packet-outcome").hidden = false;
      } else {
        showError(err);
      }
    });
  }

  $("copy").addEventListener("click", function () {
    var input = $("share-link");
    input.select();
    var done = function () { notify(t("packet.copied")); };
    if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(input.value).then(done, function () {});
    else { try { document.execCommand("copy"); done(); } catch (e) { /* selected for manual copy */ } }
  });

  // -- my red packets -------------------------------------------------------------------

  var HISTORY_PAGE = 20;
  var HISTORY_YEARS = 5; // this year and the four before it
  var historyTab = "received";

  function locale() { return lang === "zh" ? "zh-CN" : "en-GB"; }

  function when(iso) {
    return new Date(iso).toLocaleString(locale(), {
      year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit"
    });
  }

  function renderHistory() {
    show("history");
    var thisYear = new Date().getUTCFullYear();
    var state = { year: thisYear, data: null, items: [], closed: false, asked: 0 };
    current = function () { state.closed = true; };
    var select = $("year");
    select.textContent = "";
    for (var y = thisYear; y > thisYear - HISTORY_YEARS; y--) {
      var option = document.createElement("option");
      option.value = String(y);
      select.appendChild(option);
    }
    select.value = String(state.year);

    function path(cursor) {
      var base = "/v1/users/" + encodeURIComponent(auth.user) + "/" + historyTab +
        "?limit=" + HISTORY_PAGE + "&year=" + state.year;
      return cursor ? base + "&cursor=" + encodeURIComponent(cursor) : base;
    }

    function load(more) {
      var asked = ++state.asked; // only the answer to the latest question is shown
      var button = $("history-more");
      button.disabled = true;
      api("GET", path(more && state.data ? state.data.next_cursor : null)).then(function (data) {
        if (state.closed || asked !== state.asked) return;
        state.items = more ? state.items.concat(data.items) : data.items;
        state.data = data;
        draw();
      }, showError).then(function () { button.disabled = false; });
    }

    function restart() {
      state.data = null;
      state.items = [];
      draw();
      load(false);
    }

    function draw() {
      var received = historyTab === "received";
      Array.prototype.forEach.call(select.options, function (o) {
        o.textContent = t("history.yearOption", { year: o.value });
      });
      ["received", "sent"].forEach(function (tab) {
        var button = $("tab-" + tab);
        button.setAttribute("aria-selected", tab === historyTab ? "true" : "false");
        button.tabIndex = tab === historyTab ? 0 : -1;
      });
      $("history-panel").setAttribute("aria-labelledby", "tab-" + historyTab);
      $("totals-label").textContent = t(received ? "history.receivedTotal" : "history.sentTotal", { year: state.year });
      var d = state.data;
      var list = $("history-list");
      list.textContent = "";
      if (!d) {
        $("totals-amount").textContent = "—";
        $("totals-count").textContent = "";
        $("totals-extra").textContent = "";
        $("history-more").hidden = true;
        $("history-asof").textContent = "";
        return;
      }
      $("totals-amount").textContent = yuan(d.totals.amount);
      $("totals-amount").setAttribute("data-fen", String(d.totals.amount));
      $("totals-count").textContent = t(received ? "history.receivedCount" : "history.sentCount", { count: d.totals.count });
      $("totals-extra").textContent = received
        ? t("history.bestLuck", { count: d.totals.best_luck_count })
        : (d.totals.refunded ? t("history.refundedTotal", { amount: yuan(d.totals.refunded) }) : "");
      if (!state.items.length) {
        var empty = document.createElement("li");
        empty.className = "empty";
        empty.textContent = t("history.none");
        list.appendChild(empty);
      }
      state.items.forEach(function (x) { list.appendChild(record(x, received)); });
      $("history-more").hidden = !d.next_cursor;
      $("history-asof").textContent = t("history.asOf", { time: new Date(d.as_of).toLocaleString(locale()) });
    }

    function record(x, received) {
      var li = document.createElement("li");
      li.setAttribute("data-packet", x.packet_id);
      var link = document.createElement("a");
      link.className = "record";
      link.href = "/p/" + encodeURIComponent(x.packet_id);
      var main = document.createElement("span");
      main.className = "record-main";
      var title = document.createElement("span");
      title.className = "record-title";
      var sub = document.createElement("span");
      sub.className = "record-sub";
      var amount = document.createElement("span");
      amount.className = "record-amount";
      var fen = received ? x.amount : x.total_amount;
      amount.textContent = yuan(fen);
      li.setAttribute("data-fen", String(fen));
      var time = document.createElement("time");
      time.dateTime = received ? x.claimed_at : x.created_at;
      time.textContent = when(time.dateTime);
      if (received) {
        title.textContent = t("packet.from", { user: x.sender_id });
      } else {
        title.textContent = t(x.mode === "equal" ? "history.equal" : "history.lucky") +
          (x.greeting ? " · " + x.greeting : "");
        var status = t("history." + x.status, { taken: x.claimed_count, count: x.count });
        if (x.refunded_amount) status += t("history.refunded", { amount: yuan(x.refunded_amount) });
        sub.appendChild(document.createTextNode(status + " · "));
      }
      sub.appendChild(time);
      main.appendChild(title);
      main.appendChild(sub);
      link.appendChild(main);
      link.appendChild(amount);
      li.appendChild(link);
      if (received && x.best_luck) {
        li.className = "best";
        var badge = document.createElement("span");
        badge.className = "badge";
        badge.setAttribute("data-testid", "record-best");
        badge.textContent = "👑 " + t("history.bestBadge");
        link.appendChild(badge);
      }
      return li;
    }

    rerender = draw;
    ["received", "sent"].forEach(function (tab) {
      $("tab-" + tab).onclick = function () {
        if (historyTab === tab) return;
        historyTab = tab;
        restart();
      };
    });
    $("tab-received").parentNode.onkeydown = function (event) {
      if (event.key !== "ArrowLeft" && event.key !== "ArrowRight") return;
      historyTab = historyTab === "received" ? "sent" : "received";
      $("tab-" + historyTab).focus();
      restart();
    };
    select.onchange = function () {
      state.year = parseInt(select.value, 10);
      restart();
    };
    $("history-more").onclick = function () { load(true); };
    restart();
  }

  $("history-list").addEventListener("click", function (event) {
    var link = event.target.closest ? event.target.closest("a.record") : null;
    if (!link || event.ctrlKey || event.metaKey || event.shiftKey) return;
    event.preventDefault();
    go(link.getAttribute("href"));
  });

  $("records-link").addEventListener("click", function (event) {
    event.preventDefault();
    go("/me");
  });

  // -- operator dashboard ---------------------------------------------------------------

  function renderAdmin() {
    show("admin");
    var token = adminToken || (auth && tokenClaims(auth.token) && tokenClaims(auth.token).adm ? auth.token : null);
    $("admin-form").hidden = !!token;
    $("stats").hidden = !token;
    if (!token) { $("admin-token").focus(); return; }
    var timer = null, last = null;
    current = function () { if (timer) clearInterval(timer); };
    function draw() {
      var s = last;
      if (!s) return;
      var num = function (v) { return v === null || v === undefined ? "—" : String(v); };
      $("s-rate").textContent = num(s.grabs_per_second);
      $("s-granted").textContent = num(s.granted_per_second);
      $("s-backlog").textContent = num(s.backlog);
      $("s-dead").textContent = num(s.dead_letters);
      $("s-live").textContent = num(s.live_packets) + (s.live_packets_capped ? "+" : "");
      var audit = $("s-audit");
      audit.textContent = s.audit.ok === true ? "✔ " + t("admin.auditOk")
        : s.audit.ok === false ? "✖ " + t("admin.auditBad", { n: s.audit.problem_count }) : t("admin.auditUnknown");
      audit.className = s.audit.ok === true ? "ok" : "bad";
      audit.title = (s.audit.problems || []).join("\n");
      $("s-totals").textContent = Object.keys(s.grabs_total).filter(function (k) { return s.grabs_total[k]; })
        .map(function (k) { return t("outcome." + k) + " " + s.grabs_total[k]; }).join(" · ") || "0";
      $("admin-updated").textContent = t("admin.updated", { time: new Date(s.at).toLocaleTimeString(), pid: s.process });
    }
    rerender = draw;
    function tick() {
      api("GET", "/admin/stats", undefined, { token: token }).then(function (s) {
        showError(null);
        last = s;
        draw();
      }, function (err) {
        if (err.status === 401 || err.status === 403) {
          adminToken = null;
          save(ADMIN_KEY, null);
          if (timer) clearInterval(timer);
          $("admin-form").hidden = false;
          $("stats").hidden = true;
          showError(err.status === 403 ? t("admin.notAdmin") : describe(err));
        } else {
          showError(err);
        }
      });
    }
    tick();
    timer = setInterval(tick, 1000);
  }

  $("admin-form").addEventListener("submit", function (event) {
    event.preventDefault();
    var token = $("admin-token").value.trim();
    var claims = tokenClaims(token);
    if (!claims) { showError(t("signin.badToken")); return; }
    if (!claims.adm) { showError(t("admin.notAdmin")); return; }
    adminToken = token;
    save(ADMIN_KEY, { token: token });
    render();
  });

  // -- start ----------------------------------------------------------------------------

  $("lang").addEventListener("click", function () {
    lang = lang === "zh" ? "en" : "zh";
    localStorage.setItem(LANG_KEY, lang);
    applyLang();
  });
  $("brand").addEventListener("click", function (event) {
    event.preventDefault();
    go("/");
  });
  window.addEventListener("popstate", render);
  window.addEventListener("hashchange", render);
  if (auth && !tokenClaims(auth.token)) { auth = null; save(AUTH_KEY, null); }
  applyLang();
  render();
})();

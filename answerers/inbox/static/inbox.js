// Agora inbox: small progressive enhancement over server-rendered pages.
// Live updates (Server-Sent Events), local times, keyboard shortcuts.
// Everything works without it; it never builds HTML from strings except
// the rows the server rendered (and escaped) itself.
(function () {
  'use strict';
  document.documentElement.classList.add('js');

  // ---- sign in from a printed link (/inbox/login#token=…) -------------------
  // The fragment never leaves the browser; the form posts it with its
  // CSRF token, as a typed sign-in would. The fragment is dropped first,
  // so a wrong token shows the form once, not a loop.
  var tokenField = document.querySelector('form.login-form input[name="token"]');
  if (tokenField && location.hash.indexOf('#token=') === 0) {
    tokenField.value = decodeURIComponent(location.hash.slice('#token='.length));
    history.replaceState(null, '', location.pathname + location.search);
    tokenField.form.submit();
  }

  // ---- times -------------------------------------------------------------
  function span(ms) {
    var s = Math.floor(Math.abs(ms) / 1000);
    if (s < 60) return s + 's';
    var m = Math.floor(s / 60);
    if (m < 60) return m + 'm';
    var h = Math.floor(m / 60);
    if (h < 24) return m % 60 ? h + 'h ' + (m % 60) + 'm' : h + 'h';
    var d = Math.floor(h / 24);
    return h % 24 ? d + 'd ' + (h % 24) + 'h' : d + 'd';
  }
  function refreshTimes(root) {
    var now = Date.now();
    (root || document).querySelectorAll('[data-deadline]').forEach(function (el) {
      var iso = el.getAttribute('data-deadline');
      if (!iso) return;
      var left = Date.parse(iso) - now;
      var box = el.classList.contains('due') ? el : null;
      if (left <= 0) {
        el.textContent = 'overdue by ' + span(left);
        if (box) box.className = 'due due-overdue';
      } else {
        el.textContent = span(left) + ' left';
        if (box) box.className = 'due ' + (left < 3600e3 ? 'due-soon' : 'due-');
      }
    });
    (root || document).querySelectorAll('time[data-ago]').forEach(function (el) {
      var d = now - Date.parse(el.getAttribute('datetime'));
      el.textContent = d < 60e3 ? 'just now' : span(d) + ' ago';
    });
  }
  function localTimes(root) {
    (root || document).querySelectorAll('time[data-local]').forEach(function (el) {
      var t = Date.parse(el.getAttribute('datetime'));
      if (isNaN(t)) return;
      el.title = el.textContent;
      el.textContent = new Date(t).toLocaleString(undefined, { dateStyle: 'medium', timeStyle: 'short' });
    });
  }
  localTimes();
  refreshTimes();
  setInterval(refreshTimes, 15000);

  // ---- filters submit on change -------------------------------------------
  document.querySelectorAll('select[data-autosubmit]').forEach(function (sel) {
    sel.addEventListener('change', function () { sel.form.submit(); });
  });

  // ---- forms: no double submit ---------------------------------------------
  document.querySelectorAll('form').forEach(function (f) {
    f.addEventListener('submit', function () {
      if (f.classList.contains('busy')) return;
      // After the browser has taken the submitter's name and value.
      setTimeout(function () { f.classList.add('busy'); }, 0);
    });
  });

  // ---- live indicator and count ---------------------------------------------
  var live = document.getElementById('live');
  var streaming = false; // a page's own stream keeps the count and the mark
  function setLive(on) {
    if (!live) return;
    live.hidden = false;
    live.classList.toggle('on', on);
    live.querySelector('.live-text').textContent = on ? 'Live' : 'Reconnecting…';
    live.title = on ? 'Updates arrive without a reload' : 'Connection lost; reconnecting';
    document.body.setAttribute('data-live', on ? 'on' : 'off');
  }
  function setCount(n) {
    var c = document.getElementById('pending-count');
    if (c && typeof n === 'number') c.textContent = String(n);
  }

  // followCount keeps the header's count and Live mark current on a page
  // with no stream of its own (history, decisions, a closed question).
  function followCount() {
    if (!live || !live.getAttribute('data-events') || !window.EventSource) return;
    var ces = new EventSource(live.getAttribute('data-events'));
    ces.onopen = function () { setLive(true); };
    ces.onerror = function () { setLive(false); };
    ces.addEventListener('sync', function (e) { setCount(JSON.parse(e.data).pending); setLive(true); });
    ces.addEventListener('count', function (e) { setCount(JSON.parse(e.data).pending); });
  }

  function rowFor(list, id) {
    var rows = list.querySelectorAll('li[data-id]');
    for (var i = 0; i < rows.length; i++) if (rows[i].getAttribute('data-id') === id) return rows[i];
    return null;
  }

  // ---- pending list --------------------------------------------------------
  var list = document.getElementById('pending');
  if (list && window.EventSource) {
    var empty = document.getElementById('empty');
    var line = document.getElementById('shown-line');
    var filtered = list.getAttribute('data-events').indexOf('?') >= 0;
    var total = null;
    var summarize = function () {
      var n = list.querySelectorAll('li[data-id]:not(.leaving)').length;
      if (empty) empty.hidden = n > 0;
      if (line && total !== null) {
        line.textContent = total === 0 ? 'Nothing is waiting for you.'
          : filtered ? n + ' of ' + total + ' waiting match the filter.'
          : total + ' waiting, newest first.';
      }
    };
    var upsert = function (it, fresh) {
      var tpl = document.createElement('template');
      tpl.innerHTML = it.html.trim(); // rendered and escaped by the server
      var el = tpl.content.firstElementChild;
      if (!el) return;
      var old = rowFor(list, it.id);
      if (old) {
        if (old.classList.contains('selected')) el.classList.add('selected');
        old.replaceWith(el);
      } else {
        var before = null;
        list.querySelectorAll('li[data-id]').forEach(function (li) {
          if (!before && li.getAttribute('data-asked') < it.asked_at) before = li;
        });
        list.insertBefore(el, before);
        if (fresh) el.classList.add('arrived');
      }
      localTimes(el);
      refreshTimes(el);
    };
    var es = new EventSource(list.getAttribute('data-events'));
    streaming = true;
    es.onopen = function () { setLive(true); };
    es.onerror = function () { setLive(false); };
    es.addEventListener('sync', function (e) {
      var d = JSON.parse(e.data);
      var keep = {};
      d.items.forEach(function (it) { keep[it.id] = true; upsert(it, false); });
      list.querySelectorAll('li[data-id]').forEach(function (li) {
        if (!keep[li.getAttribute('data-id')]) li.remove();
      });
      total = d.pending;
      setCount(d.pending);
      setLive(true);
      summarize();
    });
    es.addEventListener('upsert', function (e) {
      var it = JSON.parse(e.data);
      upsert(it, true);
      total = it.pending;
      setCount(it.pending);
      summarize();
    });
    es.addEventListener('remove', function (e) {
      var d = JSON.parse(e.data);
      var li = rowFor(list, d.id);
      total = d.pending;
      setCount(d.pending);
      if (li) {
        li.classList.add('leaving');
        li.title = d.message;
        setTimeout(function () { li.remove(); summarize(); }, 350);
      }
      summarize();
    });
    es.addEventListener('count', function (e) {
      var d = JSON.parse(e.data);
      total = d.pending;
      setCount(d.pending);
      summarize();
    });
  }

  // ---- question page ---------------------------------------------------------
  var q = document.getElementById('question');
  var form = document.getElementById('answer-form');
  var pollThread = null;
  if (q) {
    var thread = document.getElementById('thread');
    var labels = {
      accepted: 'queued', started: 'running', needs_input: 'asked a question',
      finished: 'finished', failed: 'failed', cancelled: 'cancelled'
    };
    var renderThread = function (th) {
      var ol = document.getElementById('thread-rounds');
      if (!ol || !th) return;
      while (ol.firstChild) ol.removeChild(ol.firstChild);
      th.rounds.forEach(function (r) {
        var li = document.createElement('li');
        li.setAttribute('data-status', r.status);
        var n = document.createElement('span');
        n.className = 'round-n';
        n.textContent = 'Round ' + r.round;
        var st = document.createElement('span');
        st.className = 'state state-' + r.status;
        st.textContent = (labels[r.status] || r.status) + (r.status === 'failed' && r.reason ? ': ' + r.reason : '');
        li.appendChild(n);
        li.appendChild(st);
        if (r.question_id && r.question_id === q.getAttribute('data-id')) {
          li.className = 'this';
          var m = document.createElement('span');
          m.className = 'muted';
          m.textContent = 'this question';
          li.appendChild(m);
        } else if (r.question_id) {
          var a = document.createElement('a');
          a.href = '/inbox/questions/' + encodeURIComponent(r.question_id);
          a.textContent = 'its question';
          li.appendChild(a);
        }
        ol.appendChild(li);
      });
      thread.setAttribute('data-active', String(th.status !== 'finished' && th.status !== 'failed' && th.status !== 'cancelled'));
    };
    // Follow the thread once the question is closed, until it ends.
    pollThread = function () {
      if (!thread || pollThread.running) return;
      pollThread.running = true;
      var until = Date.now() + 10 * 60e3;
      var tick = function () {
        fetch(q.getAttribute('data-api'), { headers: { 'Accept': 'application/json' }, credentials: 'same-origin' })
          .then(function (r) { return r.ok ? r.json() : null; })
          .then(function (d) {
            if (d && d.thread) renderThread(d.thread);
            if (thread.getAttribute('data-active') === 'true' && Date.now() < until) setTimeout(tick, 1500);
            else pollThread.running = false;
          })
          .catch(function () { if (Date.now() < until) setTimeout(tick, 5000); });
      };
      tick();
    };
    if (q.getAttribute('data-status') !== 'asked' && thread && thread.getAttribute('data-active') === 'true') pollThread();

    // The table of threads waiting on the question, read again from the
    // API when its count changes (built with textContent only).
    var refreshWaiting = function () {
      fetch(q.getAttribute('data-api'), { headers: { 'Accept': 'application/json' }, credentials: 'same-origin' })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (d) {
          var sec = document.getElementById('waiting-threads');
          if (!sec || !d || !d.question) return;
          var wt = d.question.waiting_threads || [];
          var tb = sec.querySelector('tbody');
          while (tb.firstChild) tb.removeChild(tb.firstChild);
          wt.forEach(function (w, i) {
            var tr = document.createElement('tr');
            tr.setAttribute('data-thread', w.thread_id);
            var cell = function (text, code) {
              var td = document.createElement('td');
              var el = td;
              if (code) { el = document.createElement('code'); td.appendChild(el); }
              el.textContent = text || '';
              tr.appendChild(td);
              return td;
            };
            cell(w.dispatch_id, true);
            cell(w.thread_id, true);
            cell(w.subagent, false);
            var when = cell('', false);
            var t = document.createElement('time');
            t.setAttribute('datetime', w.asked_at);
            t.setAttribute('data-local', '');
            t.textContent = w.asked_at;
            when.appendChild(t);
            var last = cell('', false);
            if (i === 0) {
              var m = document.createElement('span');
              m.className = 'muted';
              m.textContent = 'asked it';
              last.appendChild(m);
            } else {
              var a = document.createElement('a');
              a.href = '/inbox/questions/' + encodeURIComponent(w.question_id);
              a.textContent = 'its question';
              last.appendChild(a);
            }
            tb.appendChild(tr);
          });
          localTimes(sec);
          sec.hidden = wt.length <= 1;
        })
        .catch(function () {});
    };

    if (q.getAttribute('data-status') === 'asked' && window.EventSource) {
      var qes = new EventSource(q.getAttribute('data-events'));
      streaming = true;
      qes.onopen = function () { setLive(true); };
      qes.onerror = function () { setLive(false); };
      qes.addEventListener('sync', function (e) { setCount(JSON.parse(e.data).pending); setLive(true); });
      qes.addEventListener('count', function (e) { setCount(JSON.parse(e.data).pending); });
      qes.addEventListener('upsert', function (e) {
        var d = JSON.parse(e.data);
        setCount(d.pending);
        // Threads joining or leaving the question: the count follows.
        var tc = document.getElementById('threads-count');
        if (tc && d.id === q.getAttribute('data-id') && typeof d.threads === 'number') {
          var changed = tc.getAttribute('data-threads') !== String(d.threads);
          tc.setAttribute('data-threads', String(d.threads));
          tc.textContent = 'asked by ' + d.threads + ' threads';
          tc.hidden = d.threads <= 1;
          if (changed) refreshWaiting();
        }
      });
      qes.addEventListener('remove', function (e) {
        var d = JSON.parse(e.data);
        setCount(d.pending);
        if (d.id !== q.getAttribute('data-id')) return;
        qes.close();
        followCount();
        if (form && form.classList.contains('busy')) return; // our own answer: the page is moving on
        var note = document.getElementById('closed-live');
        var msg = d.message;
        if (d.status === 'answered' && d.answered_at) {
          msg = 'Answered by ' + d.answered_by + ', ' +
            new Date(Date.parse(d.answered_at)).toLocaleString(undefined, { dateStyle: 'medium', timeStyle: 'short' }) +
            ': ' + d.answer;
        }
        note.textContent = msg;
        note.hidden = false;
        if (form) form.hidden = true;
        q.setAttribute('data-status', d.status);
        if (pollThread) pollThread();
      });
    }
  }

  // ---- every other page: the count alone -------------------------------------
  if (!streaming) followCount();

  // ---- keyboard ----------------------------------------------------------------
  function typing(e) {
    var t = e.target;
    return t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName));
  }
  document.addEventListener('keydown', function (e) {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey) && e.target.tagName === 'TEXTAREA' && e.target.form) {
      // Sends the textarea's own form (the answer or the decline), and
      // the free-text answer beside options with its own button.
      e.preventDefault();
      var f = e.target.form;
      var by = e.target.id === 'free-answer' ? f.querySelector('button[name="free"]') : null;
      if (f.reportValidity()) f.requestSubmit(by);
      return;
    }
    if (e.ctrlKey || e.metaKey || e.altKey || typing(e)) return;
    if (form && !form.hidden) {
      if (/^[1-9]$/.test(e.key)) {
        var b = form.querySelector('[data-key="' + e.key + '"]');
        if (b) { e.preventDefault(); b.click(); return; }
        var radio = form.querySelectorAll('input[type=radio][name=answer]')[Number(e.key) - 1];
        if (radio) { e.preventDefault(); radio.checked = true; radio.focus(); return; }
      }
      var s = form.querySelector('[data-shortcut="' + e.key.toLowerCase() + '"]');
      if (s) {
        e.preventDefault();
        if (form.reportValidity()) form.requestSubmit(s);
        return;
      }
    }
    if (list) {
      var rows = Array.prototype.slice.call(list.querySelectorAll('li[data-id]:not(.leaving)'));
      if (!rows.length) return;
      var i = rows.findIndex(function (r) { return r.classList.contains('selected'); });
      if (e.key === 'j' || e.key === 'k') {
        e.preventDefault();
        if (i >= 0) rows[i].classList.remove('selected');
        i = e.key === 'j' ? Math.min(i + 1, rows.length - 1) : Math.max(i - 1, 0);
        rows[i].classList.add('selected');
        rows[i].scrollIntoView({ block: 'nearest' });
      } else if ((e.key === 'Enter' || e.key === 'o') && i >= 0) {
        e.preventDefault();
        rows[i].querySelector('a').click();
      }
    }
  });
})();

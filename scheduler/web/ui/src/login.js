// The login page's script: the token goes to POST /api/v1/login, which sets
// the session cookie; then on to the page that was asked for. The page is
// served at any path to a client without a session, and at /login?next=.
import {safeNextPath} from './next.js';

const form = document.getElementById('login-form');
const token = document.getElementById('login-token');
const submit = document.getElementById('login-submit');
const error = document.getElementById('login-error');

function goOn() {
  const params = new URLSearchParams(location.search);
  if (location.pathname === '/login') {
    location.replace(safeNextPath(params.get('next')));
  } else {
    location.replace(location.pathname + location.search + location.hash);
  }
}

function show(message) {
  error.textContent = message;
  error.hidden = false;
}

form.addEventListener('submit', async (e) => {
  e.preventDefault();
  error.hidden = true;
  submit.disabled = true;
  try {
    const res = await fetch('/api/v1/login', {
      method: 'POST',
      credentials: 'same-origin',
      headers: {'Content-Type': 'application/json'},
      body: JSON.stringify({token: token.value.trim()}),
    });
    if (res.ok) {
      token.value = '';
      goOn();
      return;
    }
    if (res.status === 401) {
      show('That token was not accepted: check that it is a current user\'s token.');
    } else if (res.status === 429) {
      show('Too many attempts from this address: wait a minute, then try again.');
    } else {
      let message = `${res.status} ${res.statusText}`;
      try {
        const body = await res.json();
        if (body && body.error && body.error.message) message = body.error.message;
      } catch (err) { /* not JSON: keep the status line */ }
      show(`Sign-in failed: ${message}`);
    }
  } catch (err) {
    show('The scheduler could not be reached: is dlbatch-scheduler running?');
  } finally {
    submit.disabled = false;
  }
});

// Already signed in (a cookie from another tab, or the one-time link):
// the form is not needed.
fetch('/api/v1/session', {credentials: 'same-origin'}).then((res) => {
  if (res.ok) goOn();
}, () => {});

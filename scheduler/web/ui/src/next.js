// Where the login page may send the browser on: a path of this site only
// (never "//host" or "/\host", which browsers read as another site).
export function safeNextPath(next) {
  return typeof next === 'string' && next.startsWith('/') && !next.startsWith('//') &&
      !next.startsWith('/\\') ? next : '/';
}

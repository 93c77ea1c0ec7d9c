// The end-to-end scripts' one way to run `idem serve`: start it on a port
// the kernel picks (written to a port file), wait until it answers, stop it.
//
//   const d = startDaemon({binary, config, workDir});
//   const base = await waitReady(d);            // 'http://127.0.0.1:<port>'
//   ...
//   await stopDaemon(d);                         // SIGTERM, then SIGKILL
//
// The daemon's store goes to workDir/data unless `data` is false (the
// config's own store is used then), its port file to workDir/port, and its
// output to workDir/daemon.log, or to this process's when `inherit`.
import {spawn} from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function startDaemon({binary, config, workDir, args = [], env, cwd, data = true,
                             listen = true, inherit = false}) {
  const d = {
    portFile: path.join(workDir, 'port'),
    logPath: inherit ? null : path.join(workDir, 'daemon.log'),
    exited: null,  // {code, signal} once it has exited
    base: null,
  };
  const argv = ['serve', '--config', config, '--port-file', d.portFile];
  if (listen) argv.push('--listen', '127.0.0.1:0');
  if (data) argv.push('--data', path.join(workDir, 'data'));
  argv.push(...args);
  const out = inherit ? 'inherit' : fs.openSync(d.logPath, 'w');
  d.proc = spawn(binary, argv, {stdio: ['ignore', out, out], env: env ?? process.env, cwd});
  d.exit = new Promise((resolve) => d.proc.on('exit', (code, signal) => {
    d.exited = {code, signal};
    resolve(d.exited);
  }));
  return d;
}

// The last `bytes` of its log ('' when its output is inherited).
export function logTail(d, bytes = 2000) {
  if (!d.logPath) return '';
  try { return fs.readFileSync(d.logPath, 'utf8').slice(-bytes); } catch { return ''; }
}

// Its base URL once its port file names a port and GET `probe` answers
// 200. Throws, with the log's tail, if it exits first or `timeoutMs` passes
// (then it is killed: a caller that throws must not leave it running).
export async function waitReady(d, {probe = '/healthz', timeoutMs = 60000} = {}) {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end && !d.exited) {
    let port = 0;
    try { port = Number(fs.readFileSync(d.portFile, 'utf8').trim()) || 0; } catch { /* not yet */ }
    if (port > 0) {
      const base = `http://127.0.0.1:${port}`;
      const res = await fetch(base + probe).catch(() => null);
      if (res?.status === 200) {
        d.base = base;
        return base;
      }
    }
    await sleep(50);
  }
  if (!d.exited) d.proc.kill('SIGKILL');
  throw new Error((d.exited ? `the daemon exited (${JSON.stringify(d.exited)})`
                            : `the daemon did not answer ${probe} in ${timeoutMs} ms`) +
                  (d.logPath ? ': ' + logTail(d) : ''));
}

// SIGTERM, then SIGKILL if it has not exited within `timeoutMs`. Resolves
// to how it exited.
export async function stopDaemon(d, {timeoutMs = 10000} = {}) {
  if (!d || d.exited) return d?.exited ?? null;
  d.proc.kill('SIGTERM');
  const timer = setTimeout(() => { if (!d.exited) d.proc.kill('SIGKILL'); }, timeoutMs);
  const how = await d.exit;
  clearTimeout(timer);
  return how;
}

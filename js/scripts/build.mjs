// Build the JS package: compile the guest with cargo (sharing the host build's target
// directory) and transpile it with jco in JSPI async mode into dist/guest/. With
// ABRIDGE_GUEST_WASM set (the component `abridge component --out DIR` writes, or one built
// elsewhere), no cargo runs. The packed package (`npm pack`) ships dist/: installing it needs
// no build at all.
import { execFileSync } from 'node:child_process';
import { cpSync, existsSync, readFileSync, rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';

const js = dirname(dirname(fileURLToPath(import.meta.url)));
const root = dirname(js);
const targetDir = join(root, 'target', 'guest');
const given = process.env.ABRIDGE_GUEST_WASM;
const wasm = given || join(targetDir, 'wasm32-wasip2', 'guest-release', 'abridge_guest.wasm');

if (given) {
  if (!existsSync(given)) throw new Error(`ABRIDGE_GUEST_WASM=${given}: no such file`);
} else {
  try {
    execFileSync('cargo', ['build', '-q', '-p', 'abridge-guest', '--target', 'wasm32-wasip2', '--profile', 'guest-release', '--target-dir', targetDir], {
      cwd: root,
      stdio: 'inherit',
    });
  } catch (e) {
    if (e.code === 'ENOENT') {
      console.error(
        'Building dist/ (npm run build, and npm pack before it packs) compiles the guest with cargo, which is not on the PATH. Without Rust: install the packed ' +
          'package (npm pack in a clone with Rust, or a release tarball), which ships dist/ built; or set ' +
          'ABRIDGE_GUEST_WASM to the component `abridge component --out DIR` writes (DIR/abridge_guest.wasm).',
      );
      process.exit(1);
    }
    throw e;
  }
  if (!existsSync(wasm)) throw new Error(`cargo did not produce ${wasm}`);
}

// The package's interfaces as the component names them (`abridge:engine/llm@0.2.0`): the
// version is the one wit/abridge.wit declares.
const witVersion = readFileSync(join(js, '..', 'wit', 'abridge.wit'), 'utf8').match(/^package abridge:engine@([^;]+);/m)?.[1];
if (!witVersion) throw new Error('wit/abridge.wit declares no package version');
const P = 'abridge:engine';
const out = join(js, 'dist', 'guest');
rmSync(out, { recursive: true, force: true });
execFileSync(
  process.execPath,
  [
    join(js, 'node_modules', '@bytecodealliance', 'jco', 'dist', 'jco.js'),
    'transpile', wasm, '-o', out, '--name', 'abridge', '--instantiation', 'async', '--quiet',
    '--async-mode', 'jspi',
    '--async-imports', `${P}/llm@${witVersion}#generate`, `${P}/llm@${witVersion}#generate-batch`, `${P}/memory-store@${witVersion}#embed`,
    // Exports that may call the model or the embedder (through the async imports).
    '--async-exports',
    ...['after-episode-written', 'summarize-now', 'refresh', 'context'].map((f) => `${P}/summarizer@${witVersion}#${f}`),
    ...['remember', 'summarize-cluster', 'forget', 'recall'].map((f) => `${P}/memories@${witVersion}#${f}`),
  ],
  { cwd: js, stdio: 'inherit' },
);
// The SQLite schema is shared with the Rust host's store.
cpSync(join(root, 'host', 'store', 'src', 'migrations'), join(js, 'dist', 'migrations'), { recursive: true });
console.log(`built ${out}`);

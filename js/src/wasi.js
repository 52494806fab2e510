// The guest's WASI imports in JavaScript: the same sandbox as the Rust host. Rust's std
// imports wasi:cli and wasi:io even though the guest does no I/O; we supply them, but the
// environment, arguments and working directory are empty and exit is refused.
import { cli, io } from '@bytecodealliance/preview2-shim';

const environment = {
  getEnvironment: () => [],
  getArguments: () => [],
  initialCwd: () => undefined,
};

const exit = {
  exit() {
    throw new Error('the abridge guest tried to exit the process; this is a bug in the guest');
  },
};

/** WASI imports keyed as the generated `instantiate()` reads them. */
export const wasiImports = {
  'wasi:cli/environment': environment,
  'wasi:cli/exit': exit,
  'wasi:cli/stdin': cli.stdin,
  'wasi:cli/stdout': cli.stdout,
  'wasi:cli/stderr': cli.stderr,
  'wasi:cli/terminal-input': cli.terminalInput,
  'wasi:cli/terminal-output': cli.terminalOutput,
  'wasi:cli/terminal-stdin': cli.terminalStdin,
  'wasi:cli/terminal-stdout': cli.terminalStdout,
  'wasi:cli/terminal-stderr': cli.terminalStderr,
  'wasi:io/error': io.error,
  'wasi:io/poll': io.poll,
  'wasi:io/streams': io.streams,
};

// Engine errors: the WIT `error` variant as a JavaScript Error with a `kind`.

/** The WIT error cases, and `quota-exhausted` (a host guard: the monthly ceiling is reached;
 * the error then carries `spent`, `limit` and `resetsAtMs`). */
export const ERROR_KINDS = [
  'unreachable',
  'model-not-found',
  'timeout',
  'context-overflow',
  'server',
  'rejected-output',
  'storage',
  'conflict',
  'invalid-input',
  'quota-exhausted',
];

/** An actionable engine error: `kind` is one of ERROR_KINDS, `message` says how to fix it. */
export class AbridgeError extends Error {
  constructor(kind, message) {
    super(describe(kind, message));
    this.name = 'AbridgeError';
    this.kind = kind;
    this.detail = message;
  }
}

/** The same one-line descriptions as the Rust host. */
export function describe(kind, m) {
  switch (kind) {
    case 'timeout': return `timed out: ${m}`;
    case 'context-overflow': return `the prompt did not fit the model's context: ${m}`;
    case 'server': return `the model server failed: ${m}`;
    case 'rejected-output': return `the summary was rejected and nothing was written: ${m}`;
    case 'storage': return `storage error: ${m}`;
    default: return m;
  }
}

/** Throw to the guest as a WIT error (jco reads `payload`). */
export function toGuest(e) {
  if (e instanceof AbridgeError) return { payload: { tag: e.kind, val: e.detail } };
  return e; // a bug: propagates out of the export call as an ordinary exception
}

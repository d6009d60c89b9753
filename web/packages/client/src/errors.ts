// The client's errors: one root, `LingstreamError`. An `ApiError` is a refusal of the REST API with its HTTP status
// and the service's stable code (the table in docs/api.md); `TimeoutError`-like waits are not errors here: close() is
// bounded and gives up quietly.
//
//   LingstreamError
//   └── ApiError            (status, code, retryAfter)

export class LingstreamError extends Error {
  override name = "LingstreamError";
}

export class ApiError extends LingstreamError {
  override name = "ApiError";
  readonly status: number;
  readonly code: string;
  /** The `Retry-After` header (seconds) of a 429 or 503, else null. */
  readonly retryAfter: string | null;

  constructor(status: number, code: string, message: string, retryAfter: string | null = null) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
  }
}

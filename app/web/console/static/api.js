// The public GraphQL API, with the token signed in for this browser session only.

const KEY = "engram.console.token";
const ENDPOINT = new URL("../graphql", document.baseURI).href;

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor(message, code, path) {
    super(message);
    this.code = code || "ERROR";
    this.path = path;
  }

  // What a person reads: a sentence, never the JSON of the answer.
  get sentence() {
    const m = this.message.replace(/\.$/, "");
    switch (this.code) {
      case "ACCESS_DENIED":
        return `Your token's grants do not allow this: ${m}.`;
      case "UNAUTHENTICATED":
        // The server says why: "the API token expired at ...; ask for a new one", "... not valid".
        return `The server did not accept this token: ${m}. Sign in again with a valid token.`;
      case "NOT_FOUND":
        return `Not found: ${m}.`;
      case "BAD_REQUEST":
        return `The server refused this request: ${m}.`;
      case "CONFLICT":
        return `Conflict: ${m}.`;
      case "UNAVAILABLE":
        // Its database, or its embedding model: the server's sentence says which, and whether
        // trying again helps.
        return `The server cannot do this right now: ${m.charAt(0).toLowerCase()}${m.slice(1)}.`;
      case "TOO_MANY_REQUESTS":
        // The account's other requests (or turns) fill its places on the server for now.
        return `The server is busy with this account's other requests: ${m}.`;
      case "NETWORK":
        return "The server could not be reached. Check your connection and try again.";
      default:
        return `Something went wrong: ${m}.`;
    }
  }
}

export async function gql(query, variables = {}, bearer = token.get()) {
  let response;
  try {
    response = await fetch(ENDPOINT, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${bearer || ""}` },
      body: JSON.stringify({ query, variables }),
    });
  } catch {
    throw new ApiError("network", "NETWORK");
  }
  let body;
  try {
    body = await response.json();
  } catch {
    throw new ApiError(`the server answered ${response.status} without a GraphQL result`, "HTTP");
  }
  if (body.errors && body.errors.length) {
    const e = body.errors[0];
    throw new ApiError(e.message, e.extensions && e.extensions.code, e.path);
  }
  return body.data;
}

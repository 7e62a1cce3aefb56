// Where a JSON text first goes wrong. V8's JSON.parse messages often give no position, and a
// person fixing a definition wants "line 4, column 12", so this re-reads the text to find it.

const WS = /[ \t\n\r]*/y;
const NUMBER = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/y;

function at(re, text, i) {
  re.lastIndex = i;
  const m = re.exec(text);
  return m ? i + m[0].length : i;
}

/** The offset of the first error in `text`, or -1 when it is valid JSON. */
export function errorOffset(text) {
  let i = 0;
  const fail = () => {
    throw i;
  };
  const ws = () => (i = at(WS, text, i));
  const string = () => {
    if (text[i] !== '"') fail();
    i += 1;
    while (i < text.length && text[i] !== '"') {
      if (text.charCodeAt(i) < 0x20) fail();
      if (text[i] === "\\") {
        i += 1;
        if (text[i] === "u") {
          if (!/^[0-9a-fA-F]{4}$/.test(text.slice(i + 1, i + 5))) fail();
          i += 4;
        } else if (!'"\\/bfnrt'.includes(text[i] ?? "x")) fail();
      }
      i += 1;
    }
    if (text[i] !== '"') fail();
    i += 1;
  };
  const value = () => {
    ws();
    const c = text[i];
    if (c === "{") {
      i += 1;
      ws();
      if (text[i] === "}") return void (i += 1);
      for (;;) {
        ws();
        string();
        ws();
        if (text[i] !== ":") fail();
        i += 1;
        value();
        ws();
        if (text[i] === ",") i += 1;
        else if (text[i] === "}") return void (i += 1);
        else fail();
      }
    }
    if (c === "[") {
      i += 1;
      ws();
      if (text[i] === "]") return void (i += 1);
      for (;;) {
        value();
        ws();
        if (text[i] === ",") i += 1;
        else if (text[i] === "]") return void (i += 1);
        else fail();
      }
    }
    if (c === '"') return string();
    for (const word of ["true", "false", "null"]) {
      if (text.startsWith(word, i)) return void (i += word.length);
    }
    const end = at(NUMBER, text, i);
    if (end === i) fail();
    i = end;
  };
  try {
    value();
    ws();
    if (i < text.length) fail();
    return -1;
  } catch (offset) {
    if (typeof offset !== "number") throw offset;
    return offset;
  }
}

/** "line 2, column 14" for an offset into `text`. */
export function lineColumn(text, offset) {
  const before = text.slice(0, offset);
  const line = before.split("\n").length;
  return `line ${line}, column ${offset - before.lastIndexOf("\n")}`;
}

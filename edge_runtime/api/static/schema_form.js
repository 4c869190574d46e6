// A form for any verdict schema (the review page's correction form), built with DOM calls only:
// field names, titles and enum values come from the bundle, so none of them is ever parsed as HTML.
//
// SchemaForm.build(schema, value, idPrefix) returns {el, read}. read() returns {value, errors}, where
// errors are "path: message" strings checked before anything is sent (the server validates again).
// Objects are fieldsets, arrays have add/remove rows within minItems..maxItems, enums are selects
// (an array of enum values is a row of checkboxes), nullable fields get a "none" box and optional ones
// a "leave out" box, $ref into $defs/definitions is followed to MAX_REFS deep. Anything else (oneOf of
// objects, tuples, recursion past the bound) is a JSON textarea for that subtree.
"use strict";
window.SchemaForm = (() => {
  const MAX_REFS = 6;   // $refs followed from the root to a field: a recursive schema stops here
  const MAX_DEPTH = 12; // nested fieldsets (the schema budget allows 16 levels of schema objects)
  const LONG_TEXT = 120; // strings that may be longer than this get a textarea
  const MAX_FIELDS = 2000; // fields in one form: past this a part is a JSON box (minItems can nest)

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => {
      if (v === undefined || v === null || v === false) return;
      if (k === "text") el.textContent = String(v);
      else if (k in el && typeof el[k] !== "function") el[k] = v;
      else el.setAttribute(k, String(v));
    });
    children.forEach((c) => c && el.appendChild(c));
    return el;
  }

  function follow(root, ref) {
    // Only local refs: "#/$defs/Name", "#/definitions/Name" or any JSON pointer into the schema.
    if (typeof ref !== "string" || !ref.startsWith("#")) return undefined;
    let node = root;
    for (const raw of ref.slice(1).split("/").slice(1)) {
      let key;
      try { key = decodeURIComponent(raw).replace(/~1/g, "/").replace(/~0/g, "~"); } catch (e) { return undefined; } // "%zz"
      if (node === null || typeof node !== "object" || !Object.prototype.hasOwnProperty.call(node, key)) return undefined;
      node = node[key];
    }
    return node;
  }

  // Resolve refs and single-schema allOf, and say what the node is: {kind, schema, nullable, refs}.
  function classify(root, input, refs) {
    let s = input;
    for (;;) {
      if (s === true || (s && typeof s === "object" && Object.keys(s).length === 0)) return { kind: "json", schema: {}, refs };
      if (!s || typeof s !== "object") return { kind: "json", schema: {}, refs };
      if (s.$ref !== undefined) {
        if (refs >= MAX_REFS) return { kind: "json", schema: s, refs, why: "nested too deep for a form" };
        const target = follow(root, s.$ref);
        if (target === undefined) return { kind: "json", schema: s, refs };
        const { $ref, ...rest } = s;
        s = typeof target === "object" && target !== null ? { ...target, ...rest } : target;
        refs += 1;
        continue;
      }
      if (Array.isArray(s.allOf) && s.allOf.length === 1) {
        const { allOf, ...rest } = s;
        s = { ...rest, ...allOf[0] };
        continue;
      }
      break;
    }
    const alts = s.anyOf || s.oneOf;
    if (Array.isArray(alts)) {
      // X or null is a nullable X; any other union is beyond a form.
      const isNull = (a) => a && (a.type === "null" || (Array.isArray(a.enum) && a.enum.length === 1 && a.enum[0] === null) || a.const === null);
      const others = alts.filter((a) => !isNull(a));
      if (others.length === 1 && alts.length === 2 && !s.allOf) {
        const { anyOf, oneOf, ...rest } = s;
        const inner = classify(root, { ...rest, ...others[0] }, refs);
        return inner.kind === "json" ? { kind: "json", schema: s, refs } : { ...inner, nullable: true };
      }
      return { kind: "json", schema: s, refs };
    }
    if (s.allOf || s.not || s.if || s.prefixItems) return { kind: "json", schema: s, refs };
    let nullable = false;
    let type = s.type;
    if (Array.isArray(type)) {
      nullable = type.includes("null");
      const rest = type.filter((t) => t !== "null");
      if (rest.length !== 1) return { kind: "json", schema: s, refs };
      type = rest[0];
    }
    if (s.const !== undefined) return { kind: "const", schema: s, nullable, refs };
    if (Array.isArray(s.enum)) {
      const values = s.enum.filter((v) => v !== null);
      return { kind: "enum", schema: { ...s, enum: values }, nullable: nullable || values.length < s.enum.length, refs };
    }
    if (!type) type = s.properties ? "object" : s.items ? "array" : undefined;
    if (type === "object") return { kind: s.properties ? "object" : "json", schema: s, nullable, refs };
    if (type === "array") {
      const items = s.items === undefined ? {} : s.items;
      const inner = classify(root, items, refs);
      if (inner.kind === "enum" && !inner.nullable) return { kind: "choices", schema: s, items: inner.schema, nullable, refs };
      return { kind: "array", schema: s, nullable, refs };
    }
    if (["boolean", "integer", "number", "string"].includes(type)) return { kind: type, schema: s, nullable, refs };
    return { kind: "json", schema: s, refs };
  }

  // Field names are data: "__proto__" or "constructor" must read and write own keys, not Object's.
  const hasOwn = (o, k) => Object.prototype.hasOwnProperty.call(o, k);
  const put = (o, k, v) => Object.defineProperty(o, k, { value: v, enumerable: true, writable: true, configurable: true });
  const show = (v) => typeof v === "string" ? v : JSON.stringify(v);
  const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

  // A box ("none", "leave out") that greys its field out; editing the field clears it again.
  function toggle(field, idText, text, checked) {
    const box = h("input", { type: "checkbox", id: idText, checked });
    const sync = () => field.classList.toggle("sf-off", box.checked);
    box.addEventListener("change", sync);
    field.addEventListener("input", () => { box.checked = false; sync(); });
    sync();
    return { box, el: h("label", { className: "sf-inline" }, box, h("span", { text })) };
  }

  // Each builder returns {el, get(errors)}; get pushes "path: message" strings and returns the value
  // (undefined means: leave the property out). ctx: {root, prefix}; a field's id is prefix-path.
  function build(ctx, spec, value, path, depth, refs) {
    const found = classify(ctx.root, spec, refs);
    const why = depth > MAX_DEPTH ? "nested too deep for a form" : ctx.fields >= MAX_FIELDS ? "too many fields for a form" : "";
    const node = why && found.kind !== "json" ? { kind: "json", schema: spec, why } : found;
    ctx.fields += 1;
    const inner = builders[node.kind](ctx, node, value === null ? undefined : value, path, idOf(ctx, path), depth);
    if (!node.nullable) return inner;
    const none = toggle(inner.el, `${idOf(ctx, path)}--none`, "none", value === null);
    return { el: h("div", { className: "sf-nullable" }, inner.el, none.el),
      get: (errors) => none.box.checked ? null : inner.get(errors) };
  }

  const idOf = (ctx, path) => path ? `${ctx.prefix}-${path}` : ctx.prefix;

  const builders = {
    boolean(ctx, node, value, path, id) {
      const el = h("input", { type: "checkbox", id, name: path, checked: value === true });
      return { el, get: () => el.checked };
    },
    const(ctx, node) {
      return { el: h("code", { text: show(node.schema.const) }), get: () => node.schema.const };
    },
    enum(ctx, node, value, path, id) {
      const values = node.schema.enum;
      const el = h("select", { id, name: path });
      const known = values.findIndex((v) => same(v, value));
      if (known < 0) el.appendChild(h("option", { value: "", text: "— choose —" }));
      values.forEach((v, i) => el.appendChild(h("option", { value: String(i), text: show(v), selected: i === known })));
      return { el, get(errors) {
        if (el.value === "") { errors.push(`${path}: choose one of the values`); return undefined; }
        return values[Number(el.value)];
      } };
    },
    integer(ctx, node, value, path, id) { return builders.number(ctx, node, value, path, id); },
    number(ctx, node, value, path, id) {
      const s = node.schema, integer = node.kind === "integer";
      const el = h("input", { type: "number", id, name: path, step: integer ? "1" : "any", min: s.minimum, max: s.maximum,
        value: typeof value === "number" ? String(value) : "" });
      return { el, get(errors) {
        const n = el.value.trim() === "" ? NaN : Number(el.value);
        const bad = (m) => { errors.push(`${path}: ${m}`); return undefined; };
        if (!Number.isFinite(n)) return bad(integer ? "enter a whole number" : "enter a number");
        if (integer && !Number.isInteger(n)) return bad("must be a whole number");
        if (s.minimum !== undefined && n < s.minimum) return bad(`must be at least ${s.minimum}`);
        if (s.maximum !== undefined && n > s.maximum) return bad(`must be at most ${s.maximum}`);
        if (typeof s.exclusiveMinimum === "number" && n <= s.exclusiveMinimum) return bad(`must be more than ${s.exclusiveMinimum}`);
        if (typeof s.exclusiveMaximum === "number" && n >= s.exclusiveMaximum) return bad(`must be less than ${s.exclusiveMaximum}`);
        return n;
      } };
    },
    string(ctx, node, value, path, id) {
      const s = node.schema;
      const long = s.maxLength === undefined || s.maxLength > LONG_TEXT;
      const el = h(long ? "textarea" : "input", { id, name: path, maxLength: s.maxLength, rows: long ? 2 : undefined,
        value: typeof value === "string" ? value : "" });
      return { el, get(errors) {
        const v = el.value, n = [...v].length; // JSON schema counts code points
        if (s.minLength !== undefined && n < s.minLength) errors.push(`${path}: at least ${s.minLength} characters`);
        if (s.maxLength !== undefined && n > s.maxLength) errors.push(`${path}: at most ${s.maxLength} characters`);
        if (typeof s.pattern === "string") {
          let re = null;
          try { re = new RegExp(s.pattern, "u"); } catch (e) { /* not a JS regex: the server checks it */ }
          if (re && !re.test(v)) errors.push(`${path}: must match ${s.pattern}`);
        }
        return v;
      } };
    },
    object(ctx, node, value, path, id, depth) {
      const s = node.schema, own = value && typeof value === "object" && !Array.isArray(value) ? value : {};
      const required = new Set(Array.isArray(s.required) ? s.required : []);
      const box = h("fieldset", { className: "sf-object", id });
      const parts = Object.entries(s.properties).map(([name, sub]) => {
        const p = path ? `${path}.${name}` : name;
        const w = build(ctx, sub, hasOwn(own, name) ? own[name] : undefined, p, depth + 1, node.refs);
        const omit = required.has(name) ? null : toggle(w.el, `${idOf(ctx, p)}--omit`, "leave out", !hasOwn(own, name));
        box.appendChild(h("div", { className: "sf-field" },
          h("label", { className: "sf-name", htmlFor: idOf(ctx, p), text: name }), w.el, omit && omit.el));
        return { name, w, omit: omit && omit.box };
      });
      // Keys the form has no field for (allowed by additionalProperties) travel back unchanged.
      const extra = Object.entries(own).filter(([k]) => !hasOwn(s.properties, k));
      return { el: box, get(errors) {
        const out = {};
        if (s.additionalProperties !== false) extra.forEach(([k, v]) => put(out, k, v));
        parts.forEach(({ name, w, omit }) => {
          if (omit && omit.checked) return;
          const before = errors.length, v = w.get(errors);
          if (v !== undefined) put(out, name, v);
          else if (required.has(name) && errors.length === before) errors.push(`${path ? path + "." : ""}${name}: required`);
        });
        return out;
      } };
    },
    choices(ctx, node, value, path, id) {
      // An array of enum values: one checkbox per value, the result in the schema's order.
      const s = node.schema, chosen = Array.isArray(value) ? value : [];
      const boxes = node.items.enum.map((v, i) => h("input", { type: "checkbox", id: `${id}--${i}`, checked: chosen.some((c) => same(c, v)) }));
      const el = h("div", { className: "sf-choices", id }, ...boxes.map((b, i) =>
        h("label", { className: "sf-inline" }, b, h("span", { text: show(node.items.enum[i]) }))));
      return { el, get(errors) {
        const out = node.items.enum.filter((_, i) => boxes[i].checked);
        if (s.minItems !== undefined && out.length < s.minItems) errors.push(`${path}: choose at least ${s.minItems}`);
        if (s.maxItems !== undefined && out.length > s.maxItems) errors.push(`${path}: choose at most ${s.maxItems}`);
        return out;
      } };
    },
    array(ctx, node, value, path, id, depth) {
      const s = node.schema, items = s.items === undefined ? {} : s.items;
      const min = s.minItems || 0, max = s.maxItems === undefined ? Infinity : s.maxItems;
      const list = h("ol", { className: "sf-rows", start: 0 });
      const add = h("button", { type: "button", id: `${id}--add`, text: "add row" });
      const box = h("fieldset", { className: "sf-array", id }, list, add);
      let rows = [], used = 0;
      const render = (values) => {
        list.textContent = "";
        ctx.fields -= used; // the rows built last time are gone
        const mark = ctx.fields;
        rows = values.map((v, i) => {
          const p = `${path}[${i}]`;
          const w = build(ctx, items, v, p, depth + 1, node.refs);
          const remove = h("button", { type: "button", id: `${id}[${i}]--remove`, text: "remove", disabled: values.length <= min });
          remove.addEventListener("click", () => render(current().filter((_, k) => k !== i)));
          list.appendChild(h("li", {}, w.el, remove));
          return w;
        });
        add.disabled = rows.length >= max;
        used = ctx.fields - mark;
      };
      const current = () => rows.map((w) => w.get([]));
      add.addEventListener("click", () => { if (rows.length < max) render([...current(), undefined]); });
      const start = Array.isArray(value) ? value.slice(0, max === Infinity ? value.length : max) : [];
      if (ctx.fields + Math.max(start.length, min) > MAX_FIELDS) {
        return builders.json(ctx, { kind: "json", schema: s, why: "too many rows for a form" }, value, path, id);
      }
      while (start.length < min) start.push(undefined);
      render(start);
      return { el: box, get(errors) {
        const out = rows.map((w, i) => {
          const before = errors.length, v = w.get(errors);
          if (v === undefined && errors.length === before) errors.push(`${path}[${i}]: fill in this row`);
          return v;
        });
        if (out.length < min) errors.push(`${path}: at least ${min} rows`);
        return out;
      } };
    },
    json(ctx, node, value, path, id) {
      const el = h("textarea", { id, name: path, className: "sf-json", rows: 3,
        value: value === undefined ? "" : JSON.stringify(value, null, 1) });
      return { el: h("div", {}, el, h("small", { text: node.why || "JSON (this part of the schema has no form)" })), get(errors) {
        if (el.value.trim() === "") return undefined;
        try { return JSON.parse(el.value); } catch (e) { errors.push(`${path}: not valid JSON (${e.message})`); return undefined; }
      } };
    },
  };

  return {
    build(schema, value, idPrefix) {
      const w = build({ root: schema, prefix: idPrefix, fields: 0 }, schema, value, "", 0, 0);
      return { el: w.el, read() { const errors = []; const v = w.get(errors); return { value: v, errors }; } };
    },
  };
})();

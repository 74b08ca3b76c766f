// Package grammar constrains generated text to a grammar: a JSON schema, free JSON, a regular
// expression or a GBNF grammar (llama.cpp's EBNF dialect) compiles to one byte-level grammar,
// and a Matcher computes, per decoding step, the bitmask of vocabulary tokens that keep the
// output inside it.
//
// # Matching
//
// A compiled Grammar is a set of rules whose terminals are byte sets (character classes become
// alternatives of UTF-8 byte ranges). It is matched by a pushdown automaton built lazily: a
// parse stack is a list of grammar positions, a state is the set of all stacks alive after the
// bytes so far (so ambiguous grammars need no backtracking), and the transitions state x byte
// and each state's token mask are computed once and cached in the Grammar. The mask of a state
// is one linear pass over the vocabulary's byte trie (TokenTable) that skips every subtree
// whose prefix the grammar rejects; a state reached again (the same rule at the same nesting,
// e.g. the value of the 3rd property of an object, or anywhere inside a string) costs one copy.
// This is the context-independent-token idea of xgrammar taken to whole states: tokens are
// classified once per state rather than once per grammar position. Left-recursive rules are
// rejected at compile time; Limits bound the grammar size, the states and the compile time,
// so adversarial input fails with an error instead of hanging or exhausting memory.
//
// # JSON layout
//
// Like OpenAI's strict structured outputs, JSON output has no free whitespace: one compact,
// deterministic layout, `{"a":1,"b":[true,null]}`, with properties in the order the schema
// lists them, strings with only the required escapes (\" \\ and control characters; \uXXXX
// escapes, surrogates excluded, are accepted), numbers as JSON numbers. A constrained model
// cannot spend tokens on whitespace, and a sampled output is one of few spellings of a value.
//
// Schema semantics: properties absent from `required` are optional; additionalProperties
// absent means none when properties are listed (strict mode) and any when none are;
// additional properties come after the listed ones and their names are not checked against
// them. oneOf is compiled as anyOf (exclusivity is not enforced); allOf only with one schema.
// Integer bounds are exact; number bounds must be integral and inclusive (fractions allowed,
// no exponent). Formats date, time, date-time (RFC 3339, leap years included), uuid, email,
// ipv4, hostname and uri are supported; patterns use the subset of CompileRegex with
// JSON-schema search semantics (unanchored sides match anything). Keywords the compiler cannot
// express (not, if/then/else, patternProperties, uniqueItems, multipleOf, ...) are errors
// (SchemaError, with the JSON pointer of the keyword) rather than silently ignored.
//
// # Use in the engine
//
//	table, _ := grammar.NewTokenTable(vocab, eosIDs)  // once per tokenizer: vocab[id] = token bytes
//	g, err := grammar.CompileJSONSchema(schema)       // per request (or cached per schema); err -> 400
//	m, _ := grammar.NewMatcher(g, table)              // per sequence (n > 1: one each)
//	mask := make([]uint32, table.MaskWords())
//	for !m.IsTerminated() {
//		m.FillMask(mask)         // before sampling: disallowed logits to -inf (or upload the mask)
//		tok := sample(logits, mask)
//		m.Accept(tok)            // error = the token is outside the grammar
//	}
//
// Speculative (MTP) drafts: Accept each draft token in turn and stop at the first error (that
// draft and the ones after it are rejected); after verification, Rollback(k) removes the k
// accepted draft tokens the target model did not confirm. Jump-forward: ForcedBytes returns the
// bytes every continuation starts with (e.g. `","name":"` after a value): they may be emitted
// without a forward pass and passed to AcceptBytes, but tokenising them separately can differ
// from the tokens the model would have produced across the boundary (the next token may have
// merged with them), so only emit them up to a point where the tokenizer splits anyway.
// Special tokens (empty bytes in the table) are never allowed; EOS only where the grammar can
// end. With reasoning, start the Matcher after the thinking block ends.
//
// A Grammar and a TokenTable are safe for concurrent use (the automaton takes a mutex while it
// grows); a Matcher is not.
package grammar

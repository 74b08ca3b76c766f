package ptxemu

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Inline asm blocks are PTX scopes ("{ .reg .pred P; L: ... bra L; }"):
// the registers and labels they declare are theirs, so one asm block
// inlined twice declares the same names twice. unscope renames what each
// nested scope declares to a name of its own (name$sN) and drops the scope
// markers, so the rest of the parser sees one flat namespace.

var (
	reIdent   = regexp.MustCompile(`%?[A-Za-z_$][\w$]*`)
	reRegName = regexp.MustCompile(`^(%?[A-Za-z_$][\w$]*?)(?:<(\d+)>)?$`)
)

// scopeNames is what one scope declares: plain names, and register ranges
// (%r<4> declares %r0..%r3) by prefix.
type scopeNames struct {
	id     int
	names  map[string]bool
	ranges map[string]int
}

func (s *scopeNames) rename(tok string) (string, bool) {
	if s.names[tok] {
		return fmt.Sprintf("%s$s%d", tok, s.id), true
	}
	for p, n := range s.ranges {
		if rest := strings.TrimPrefix(tok, p); rest != tok && rest != "" {
			if i, err := strconv.Atoi(rest); err == nil && i < n && (rest == "0" || rest[0] != '0') {
				return fmt.Sprintf("%s$s%d_%s", p, s.id, rest), true
			}
		}
	}
	return tok, false
}

// unscope takes statements with "{" and "}" scope markers.
func unscope(stmts []string) ([]string, error) {
	// pass 1: what each scope declares
	var scopes []*scopeNames
	var stack []int
	scopeOf := make([]int, len(stmts)) // innermost scope of each statement, -1 at top level
	for i, s := range stmts {
		switch s {
		case "{":
			scopes = append(scopes, &scopeNames{id: len(scopes), names: map[string]bool{}, ranges: map[string]int{}})
			stack = append(stack, len(scopes)-1)
			scopeOf[i] = -1
			continue
		case "}":
			if len(stack) == 0 {
				return nil, fmt.Errorf("ptxemu: unbalanced scope braces")
			}
			stack = stack[:len(stack)-1]
			scopeOf[i] = -1
			continue
		}
		scopeOf[i] = -1
		if len(stack) == 0 {
			continue
		}
		cur := scopes[stack[len(stack)-1]]
		scopeOf[i] = cur.id
		switch {
		case strings.HasSuffix(s, ":"):
			cur.names[strings.TrimSuffix(s, ":")] = true
		case strings.HasPrefix(s, ".reg"):
			f := strings.Fields(strings.TrimSuffix(s, ";"))
			if len(f) < 3 {
				continue
			}
			for _, n := range strings.Split(strings.Join(f[2:], ""), ",") {
				mt := reRegName.FindStringSubmatch(n)
				if mt == nil {
					continue
				}
				if mt[2] != "" {
					k, _ := strconv.Atoi(mt[2])
					cur.ranges[mt[1]] = k
				} else {
					cur.names[mt[1]] = true
				}
			}
		}
	}
	if len(stack) != 0 {
		return nil, fmt.Errorf("ptxemu: unbalanced scope braces")
	}
	if len(scopes) == 0 {
		return stmts, nil
	}
	// walk again: scopes get their ids in the same order; parent links
	// resolve a name in the innermost scope declaring it
	parent := make([]int, len(scopes))
	// walk again, assigning ids in order of appearance
	next := 0
	out := make([]string, 0, len(stmts))
	for i, s := range stmts {
		switch s {
		case "{":
			if len(stack) > 0 {
				parent[next] = stack[len(stack)-1]
			} else {
				parent[next] = -1
			}
			stack = append(stack, next)
			next++
			continue
		case "}":
			stack = stack[:len(stack)-1]
			continue
		}
		if scopeOf[i] < 0 {
			out = append(out, s)
			continue
		}
		resolve := func(tok string) string {
			for id := scopeOf[i]; id >= 0; id = parent[id] {
				if r, ok := scopes[id].rename(tok); ok {
					return r
				}
			}
			return tok
		}
		out = append(out, renameStmt(s, resolve))
	}
	return out, nil
}

// renameStmt renames the identifiers of a statement: a label, a
// declaration's names, or an instruction's guard and operands (not its
// opcode).
func renameStmt(s string, resolve func(string) string) string {
	if strings.HasSuffix(s, ":") {
		return resolve(strings.TrimSuffix(s, ":")) + ":"
	}
	head, rest := "", s
	if strings.HasPrefix(s, "@") { // guard
		i := strings.IndexAny(s, " \t")
		if i < 0 {
			return s
		}
		head, rest = reIdent.ReplaceAllStringFunc(s[:i], resolve)+" ", strings.TrimSpace(s[i:])
	}
	if strings.HasPrefix(rest, ".reg") {
		f := strings.Fields(rest)
		if len(f) < 3 {
			return s
		}
		names := strings.Split(strings.TrimSuffix(strings.Join(f[2:], ""), ";"), ",")
		for k, n := range names {
			mt := reRegName.FindStringSubmatch(n)
			if mt == nil {
				continue
			}
			if mt[2] != "" {
				r := resolve(mt[1] + "0")
				names[k] = strings.TrimSuffix(r, "0") + "<" + mt[2] + ">"
			} else {
				names[k] = resolve(mt[1])
			}
		}
		return head + f[0] + " " + f[1] + " " + strings.Join(names, ", ") + ";"
	}
	op, args := rest, ""
	if i := strings.IndexAny(rest, " \t"); i >= 0 {
		op, args = rest[:i], rest[i:]
	}
	return head + op + reIdent.ReplaceAllStringFunc(args, resolve)
}

// Command extract turns the inputs of Argo's own FormulateRetryWorkflow unit
// tests into data files for rewind's differential tests.
//
// Many of Argo's fixtures are built or changed in Go code before the call (phases
// set, earlier retries chained), so copying the YAML literals would not give what
// FormulateRetryWorkflow really received. Instead every call site in the test
// files of Argo's workflow/util package is rewritten (go/ast) to go through a
// recorder, and the package's tests run in a copy of Argo's module. Each call
// records the workflow exactly as passed, with its options.
//
// Usage: extract -out DIR VERSION=ARGO_SOURCE_DIR...   (the first source wins
// a file name; later ones only add the calls they have and it lacks).
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

const pkgDir = "workflow/util"

// recorderSource is added to Argo's package: it records each call's inputs
// as one JSON line in $ORACLE_RECORD_FILE, then makes the real call.
const recorderSource = `package util

import (
	"context"
	"encoding/json"
	"os"

	wfv1 "MODULE/pkg/apis/workflow/v1alpha1"
)

func oracleRecordRetry(site string, ctx context.Context, wf *wfv1.Workflow, restartSuccessful bool, nodeFieldSelector string, parameters []string) (*wfv1.Workflow, []string, error) {
	workflow, err := json.Marshal(wf)
	if err != nil {
		panic(err)
	}
	if wf.Labels != nil && len(wf.Labels) == 0 {
		// Go omits an empty labels map, yet v3.7 panics on a nil one: keep the
		// test's "labels": {} (it decodes back to an empty map).
		workflow = withEmptyLabels(workflow)
	}
	line, err := json.Marshal(map[string]any{
		"site": site, "workflow": json.RawMessage(workflow), "restartSuccessful": restartSuccessful,
		"nodeFieldSelector": nodeFieldSelector, "parameters": parameters,
	})
	if err != nil {
		panic(err)
	}
	f, err := os.OpenFile(os.Getenv("ORACLE_RECORD_FILE"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	if _, err := f.Write(append(line, '\n')); err != nil {
		panic(err)
	}
	return FormulateRetryWorkflow(ctx, wf, restartSuccessful, nodeFieldSelector, parameters)
}

func withEmptyLabels(workflow []byte) []byte {
	var doc, metadata map[string]json.RawMessage
	if err := json.Unmarshal(workflow, &doc); err != nil {
		panic(err)
	}
	if err := json.Unmarshal(doc["metadata"], &metadata); err != nil {
		panic(err)
	}
	metadata["labels"] = json.RawMessage("{}")
	var err error
	if doc["metadata"], err = json.Marshal(metadata); err != nil {
		panic(err)
	}
	if workflow, err = json.Marshal(doc); err != nil {
		panic(err)
	}
	return workflow
}
`

// site is one FormulateRetryWorkflow call in Argo's test source.
type site struct {
	File string `json:"file"`
	Line int    `json:"line"`
	Test string `json:"test"`
}

func (s site) key() string { return fmt.Sprintf("%s:%d %s", s.File, s.Line, s.Test) }

// recorded is one call as the recorder saw it at run time.
type recorded struct {
	Site              string          `json:"site"`
	Workflow          json.RawMessage `json:"workflow"`
	RestartSuccessful bool            `json:"restartSuccessful"`
	NodeFieldSelector string          `json:"nodeFieldSelector"`
	Parameters        []string        `json:"parameters"`
}

// manifestCase is one entry of cases.json.
type manifestCase struct {
	ID                string   `json:"id"`
	File              string   `json:"file"`
	RestartSuccessful bool     `json:"restartSuccessful"`
	NodeFieldSelector string   `json:"nodeFieldSelector"`
	Parameters        []string `json:"parameters"`
	Sources           []string `json:"sources"`
}

func main() {
	out := flag.String("out", "tests/data/argo-retry", "directory for workflow files and cases.json")
	flag.Parse()
	if flag.NArg() == 0 {
		log.Fatal("usage: extract -out DIR VERSION=ARGO_SOURCE_DIR...")
	}
	m := newManifest(*out)
	for _, arg := range flag.Args() {
		version, dir, ok := strings.Cut(arg, "=")
		if !ok {
			log.Fatalf("argument %q: want VERSION=ARGO_SOURCE_DIR", arg)
		}
		sites, calls := record(version, dir)
		hit := map[string]bool{}
		for _, c := range calls {
			hit[c.Site] = true
			m.add(version, c)
		}
		for _, s := range sites {
			if !hit[s.key()] {
				log.Fatalf("%s: call site %s never ran; its fixture would be missing", version, s.key())
			}
		}
		log.Printf("%s: %d call sites, %d calls recorded", version, len(sites), len(calls))
	}
	m.write()
}

// record rewrites the package's tests in an overlay, runs them and returns the
// call sites found and the calls recorded.
func record(version, dir string) ([]site, []recorded) {
	modFile, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	check(err)
	module := regexp.MustCompile(`(?m)^module (\S+)`).FindSubmatch(modFile)
	if module == nil {
		log.Fatalf("%s: no module line in go.mod", dir)
	}
	tmp, err := os.MkdirTemp("", "argo-retry-extract-")
	check(err)
	defer os.RemoveAll(tmp)

	// The module cache is read-only and -overlay refuses files beneath it, so
	// the rewritten tests run in a copy of Argo's module.
	src := filepath.Join(tmp, "argo")
	check(os.CopyFS(src, os.DirFS(dir)))
	var sites []site
	tests, err := filepath.Glob(filepath.Join(src, pkgDir, "*_test.go"))
	check(err)
	for _, path := range tests {
		rewritten, found := rewrite(path)
		sites = append(sites, found...)
		check(os.WriteFile(path, rewritten, 0o644))
	}
	recorder := strings.ReplaceAll(recorderSource, "MODULE", string(module[1]))
	check(os.WriteFile(filepath.Join(src, pkgDir, "oracle_record_test.go"), []byte(recorder), 0o644))

	// Every test in the package runs: a failing Argo assertion is irrelevant
	// here, only that every call site ran (checked by the caller).
	recordFile := filepath.Join(tmp, "calls.jsonl")
	cmd := exec.Command("go", "test", "-count=1", "./"+pkgDir)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "ORACLE_RECORD_FILE="+recordFile)
	cmd.Stderr = os.Stderr
	testOut, err := cmd.Output()
	if err != nil {
		log.Printf("%s: go test: %v (Argo's own assertions may fail outside its CI; continuing)\n%s", version, err, tail(testOut))
	}
	data, err := os.ReadFile(recordFile)
	check(err)
	var calls []recorded
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		var c recorded
		check(json.Unmarshal(line, &c))
		calls = append(calls, c)
	}
	return sites, calls
}

// rewrite replaces each FormulateRetryWorkflow(args) in a test file by
// oracleRecordRetry("file:line Test/subtest", args).
func rewrite(path string) ([]byte, []site) {
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
	check(err)
	var sites []site
	for _, decl := range file.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		var subtests []string // names of the enclosing t.Run calls
		var visit func(n ast.Node) bool
		visit = func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if name, body := subtest(call); body != nil {
				subtests = append(subtests, name)
				ast.Inspect(body, visit)
				subtests = subtests[:len(subtests)-1]
				return false
			}
			if id, ok := call.Fun.(*ast.Ident); ok && id.Name == "FormulateRetryWorkflow" {
				s := site{
					File: filepath.Base(path),
					Line: fset.Position(call.Pos()).Line,
					Test: strings.Join(append([]string{fn.Name.Name}, subtests...), "/"),
				}
				sites = append(sites, s)
				id.Name = "oracleRecordRetry"
				label := &ast.BasicLit{Kind: token.STRING, Value: strconv.Quote(s.key())}
				call.Args = append([]ast.Expr{label}, call.Args...)
			}
			return true
		}
		ast.Inspect(fn.Body, visit)
	}
	var buf bytes.Buffer
	check(format.Node(&buf, fset, file))
	return buf.Bytes(), sites
}

// subtest recognises t.Run("name", func(...) {...}); a non-literal name is
// kept as its source expression.
func subtest(call *ast.CallExpr) (string, *ast.BlockStmt) {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Run" || len(call.Args) != 2 {
		return "", nil
	}
	lit, ok := call.Args[1].(*ast.FuncLit)
	if !ok {
		return "", nil
	}
	if name, ok := call.Args[0].(*ast.BasicLit); ok && name.Kind == token.STRING {
		if s, err := strconv.Unquote(name.Value); err == nil {
			return s, lit.Body
		}
	}
	if id, ok := call.Args[0].(*ast.Ident); ok {
		return "<" + id.Name + ">", lit.Body
	}
	return "<subtest>", lit.Body
}

// manifest collects workflow files (deduplicated by content) and cases
// (deduplicated by file and options, keeping every source that produced them).
type manifest struct {
	dir    string
	files  map[string]string // content hash -> file name
	used   map[string]bool   // file names taken
	cases  []*manifestCase
	byCase map[string]*manifestCase
}

func newManifest(dir string) *manifest {
	return &manifest{dir: dir, files: map[string]string{}, used: map[string]bool{}, byCase: map[string]*manifestCase{}}
}

func (m *manifest) add(version string, c recorded) {
	var workflow any
	dec := json.NewDecoder(bytes.NewReader(c.Workflow))
	dec.UseNumber() // keep numbers exactly as Go wrote them
	check(dec.Decode(&workflow))
	pretty, err := json.MarshalIndent(dropNulls(workflow), "", "  ")
	check(err)
	pretty = append(pretty, '\n')
	sum := sha256.Sum256(pretty)
	hash := hex.EncodeToString(sum[:])
	file, ok := m.files[hash]
	if !ok {
		file = m.fileName(version, c.Site)
		m.files[hash] = file
		check(os.MkdirAll(m.dir, 0o755))
		check(os.WriteFile(filepath.Join(m.dir, file), pretty, 0o644))
	}
	params, err := json.Marshal(c.Parameters)
	check(err)
	key := fmt.Sprintf("%s|%t|%s|%s", file, c.RestartSuccessful, c.NodeFieldSelector, params)
	source := version + " " + c.Site
	if mc, ok := m.byCase[key]; ok {
		if !slices.Contains(mc.Sources, source) {
			mc.Sources = append(mc.Sources, source)
		}
		return
	}
	mc := &manifestCase{
		ID:                fmt.Sprintf("%03d-%s", len(m.cases)+1, strings.TrimSuffix(file, ".json")),
		File:              file,
		RestartSuccessful: c.RestartSuccessful,
		NodeFieldSelector: c.NodeFieldSelector,
		Parameters:        c.Parameters,
		Sources:           []string{source},
	}
	m.byCase[key] = mc
	m.cases = append(m.cases, mc)
}

// fileName derives a readable name from the test name, e.g.
// "TestFormulateRetryWorkflow/Skipped and Suspended Nodes" ->
// "formulate-retry-workflow-skipped-and-suspended-nodes.json"; a fixture that
// differs in a later version gets the version added ("...-v3.7.6.json").
func (m *manifest) fileName(version, siteKey string) string {
	_, test, _ := strings.Cut(siteKey, " ")
	test = strings.TrimPrefix(test, "Test")
	test = regexp.MustCompile(`([a-z0-9])([A-Z])`).ReplaceAllString(test, "$1-$2")
	slug := strings.Trim(regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(test), "-"), "-")
	name := slug + ".json"
	if m.used[name] {
		slug += "-" + version
		name = slug + ".json"
	}
	for i := 2; m.used[name]; i++ {
		name = fmt.Sprintf("%s-%d.json", slug, i)
	}
	m.used[name] = true
	return name
}

func (m *manifest) write() {
	data, err := json.MarshalIndent(m.cases, "", "  ")
	check(err)
	check(os.WriteFile(filepath.Join(m.dir, "cases.json"), append(data, '\n'), 0o644))
	log.Printf("%d workflow files, %d cases in %s", len(m.files), len(m.cases), m.dir)
}

// dropNulls removes null object members: Go decodes them like absent ones,
// and the versions differ only in whether they write some of them (v3's
// apimachinery writes "creationTimestamp": null), which must not make two
// identical fixtures look different.
func dropNulls(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, member := range v {
			if member == nil {
				delete(v, k)
			} else {
				v[k] = dropNulls(member)
			}
		}
	case []any:
		for i := range v {
			v[i] = dropNulls(v[i])
		}
	}
	return v
}

func tail(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// Command oracle runs Argo Workflows v3.7's own retry code on workflows read from
// stdin, so rewind's retry planner can be compared with the real thing.
//
// Input: one JSON case per line; output: one JSON result per line, same order.
// It follows the Argo Server's RetryWorkflow (server/workflow/workflow_server.go)
// minus the I/O: hydrate, FormulateRetryWorkflow, dehydrate. See ../NOTES.md.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"

	log "github.com/sirupsen/logrus"

	"github.com/argoproj/argo-workflows/v3/persist/sqldb"
	wfv1 "github.com/argoproj/argo-workflows/v3/pkg/apis/workflow/v1alpha1"
	"github.com/argoproj/argo-workflows/v3/util/file"
	"github.com/argoproj/argo-workflows/v3/workflow/hydrator"
	"github.com/argoproj/argo-workflows/v3/workflow/packer"
	"github.com/argoproj/argo-workflows/v3/workflow/util"
)

type retryCase struct {
	ID                string          `json:"id"`
	Workflow          json.RawMessage `json:"workflow"`
	RestartSuccessful bool            `json:"restartSuccessful"`
	NodeFieldSelector string          `json:"nodeFieldSelector"`
	Parameters        []string        `json:"parameters"`
	MaxWorkflowSize   int             `json:"maxWorkflowSize"`
	// Argo's WORKFLOW_COMPRESSION_ALGORITHM and WORKFLOW_COMPRESSION_LEVEL for
	// this case ("" leaves them unset). GZIP_IMPLEMENTATION is read once when
	// the process starts, so it is set for a whole oracle process instead.
	CompressionAlgorithm string `json:"compressionAlgorithm"`
	CompressionLevel     string `json:"compressionLevel"`
}

type retryResult struct {
	ID           string         `json:"id"`
	Workflow     *wfv1.Workflow `json:"workflow"`
	PodsToDelete []string       `json:"podsToDelete"`
	Error        *string        `json:"error"`
	// Size is len(json.Marshal(workflow)), the size Argo compares with
	// MAX_WORKFLOW_SIZE (0 without a workflow).
	Size int `json:"size"`
	// CompressedSize is that size with the retried nodes compressed as Argo
	// would compress them, also when Argo refused the retry as too large
	// (0 when the retry failed before, or there are no nodes to compress).
	CompressedSize int `json:"compressedSize"`
}

// An Argo Server without persistence uses the explosive repo, so offloaded
// nodes fail with Argo's own "offload node status is not supported".
var wfHydrator = hydrator.New(sqldb.ExplosiveOffloadNodeStatusRepo)

func main() {
	// v3.7 logs through logrus' global logger; only errors, on stderr.
	log.SetOutput(os.Stderr)
	log.SetLevel(log.ErrorLevel)
	ctx := context.Background()

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<30) // workflows can be far larger than a default 64 KiB line
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var c retryCase
		res := retryResult{PodsToDelete: []string{}}
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			res.Error = errText(fmt.Errorf("decode case: %w", err))
		} else {
			res = run(ctx, c)
		}
		if err := out.Encode(res); err != nil {
			fmt.Fprintln(os.Stderr, "oracle: write result:", err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "oracle: read cases:", err)
		os.Exit(1)
	}
}

// run retries one case; a panic inside Argo's code becomes that case's error.
func run(ctx context.Context, c retryCase) (res retryResult) {
	res = retryResult{ID: c.ID, PodsToDelete: []string{}}
	defer func() {
		if r := recover(); r != nil {
			if entry, ok := r.(*log.Entry); ok {
				r = entry.Message // logrus' Panicf panics with its entry; only the message is stable
			}
			res = retryResult{ID: c.ID, PodsToDelete: []string{}, Error: errText(fmt.Errorf("panic: %v", r))}
		}
	}()
	defer withMaxWorkflowSize(c.MaxWorkflowSize)()
	defer withEnv("WORKFLOW_COMPRESSION_ALGORITHM", c.CompressionAlgorithm)()
	defer withEnv("WORKFLOW_COMPRESSION_LEVEL", c.CompressionLevel)()

	wf := &wfv1.Workflow{}
	if err := json.Unmarshal(c.Workflow, wf); err != nil {
		res.Error = errText(fmt.Errorf("decode workflow: %w", err))
		return res
	}
	// The server receives no parameters as nil (an empty repeated gRPC field),
	// so an empty list becomes nil too. Argo's code only tells them apart in
	// createNewRetryWorkflow's `parameters != nil`, which guards a log line and
	// an overrideParameters call that does nothing for an empty list.
	params := c.Parameters
	if len(params) == 0 {
		params = nil
	}
	if err := wfHydrator.Hydrate(wf); err != nil {
		res.Error = errText(err)
		return res
	}
	wf, pods, err := util.FormulateRetryWorkflow(ctx, wf, c.RestartSuccessful, c.NodeFieldSelector, params)
	if err != nil {
		res.Error = errText(err)
		return res
	}
	res.CompressedSize = compressedSize(ctx, wf)
	if err := wfHydrator.Dehydrate(wf); err != nil {
		res.Error = errText(err)
		return res
	}
	res.Workflow = wf
	res.Size = marshalledSize(wf)
	res.PodsToDelete = append(res.PodsToDelete, pods...) // non-nil: no pods is [], not null
	slices.Sort(res.PodsToDelete)
	return res
}

// withMaxWorkflowSize sets the size limit the packer reads from the
// environment on every call (packer.SetMaxWorkflowSize), and returns a
// function restoring the previous value: the packer's own reset would unset it.
func withMaxWorkflowSize(size int) func() {
	if size == 0 {
		return func() {}
	}
	prev, had := os.LookupEnv("MAX_WORKFLOW_SIZE")
	packer.SetMaxWorkflowSize(size)
	return func() {
		if had {
			_ = os.Setenv("MAX_WORKFLOW_SIZE", prev)
		} else {
			_ = os.Unsetenv("MAX_WORKFLOW_SIZE")
		}
	}
}

// withEnv sets an environment variable Argo reads on every call for one
// case, unless value is empty, and returns a function restoring it.
func withEnv(key, value string) func() {
	if value == "" {
		return func() {}
	}
	prev, had := os.LookupEnv(key)
	_ = os.Setenv(key, value)
	return func() {
		if had {
			_ = os.Setenv(key, prev)
		} else {
			_ = os.Unsetenv(key)
		}
	}
}

func marshalledSize(wf *wfv1.Workflow) int {
	b, err := json.Marshal(wf)
	if err != nil {
		panic(err)
	}
	return len(b)
}

// compressedSize is what packer.compressWorkflow measures: the workflow with
// its nodes moved to compressedNodes by Argo's own encoder.
func compressedSize(ctx context.Context, wf *wfv1.Workflow) int {
	if len(wf.Status.Nodes) == 0 {
		return 0
	}
	nodes, err := json.Marshal(wf.Status.Nodes)
	if err != nil {
		panic(err)
	}
	packed := wf.DeepCopy()
	packed.Status.CompressedNodes = file.CompressEncodeString(string(nodes))
	packed.Status.Nodes = nil
	return marshalledSize(packed)
}

func errText(err error) *string {
	s := err.Error()
	return &s
}

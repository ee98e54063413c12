// kiln-health judges kiln's objects the way GitOps tools do, with their own libraries:
//
//	kiln-health kstatus FILE...         kstatus (Flux, kpt, cli-utils) status.Compute
//	kiln-health argocd SCRIPT FILE...   an Argo CD resource health check (Lua 5.1, gopher-lua)
//
// Each FILE holds one object as JSON (what `kubectl get -o json` prints). For each it prints
// one line of JSON: {"file", "kind", "name", "status", "message"}. Exit status 0 unless an
// input cannot be read or judged. The e2e tests compare the verdicts with what the objects
// say.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	File    string `json:"file"`
	Kind    string `json:"kind"`
	Name    string `json:"name"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: kiln-health kstatus FILE... | kiln-health argocd SCRIPT FILE...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "kstatus":
		err = each(os.Args[2:], kstatus)
	case "argocd":
		if len(os.Args) < 4 {
			err = fmt.Errorf("argocd needs SCRIPT and at least one FILE")
			break
		}
		script, rerr := os.ReadFile(os.Args[2])
		if rerr != nil {
			err = rerr
			break
		}
		err = each(os.Args[3:], func(u *unstructured.Unstructured) (string, string, error) {
			return argocd(string(script), u.Object)
		})
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kiln-health:", err)
		os.Exit(1)
	}
}

func each(files []string, judge func(*unstructured.Unstructured) (string, string, error)) error {
	out := json.NewEncoder(os.Stdout)
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		s, msg, err := judge(u)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if err := out.Encode(verdict{f, u.GetKind(), u.GetName(), s, msg}); err != nil {
			return err
		}
	}
	return nil
}

func kstatus(u *unstructured.Unstructured) (string, string, error) {
	r, err := status.Compute(u)
	if err != nil {
		return "", "", err
	}
	return r.Status.String(), r.Message, nil
}

// argocd runs a health check as Argo CD's controller does (util/lua in argo-cd): the object as
// the global `obj`, the script's return value a table with `status` and `message`.
func argocd(script string, obj map[string]interface{}) (string, string, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	// The libraries Argo CD opens for health checks.
	for _, lib := range []struct {
		name string
		fn   lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.StringLibName, lua.OpenString},
		{lua.MathLibName, lua.OpenMath},
	} {
		l.Push(l.NewFunction(lib.fn))
		l.Push(lua.LString(lib.name))
		l.Call(1, 0)
	}
	l.SetGlobal("obj", toLua(l, obj))
	if err := l.DoString(script); err != nil {
		return "", "", err
	}
	ret, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		return "", "", fmt.Errorf("the script returned %s, not a table", l.Get(-1).Type())
	}
	s, _ := ret.RawGetString("status").(lua.LString)
	m, _ := ret.RawGetString("message").(lua.LString)
	switch string(s) {
	case "Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown":
	default:
		return "", "", fmt.Errorf("the script returned status %q, which Argo CD does not know", s)
	}
	return string(s), string(m), nil
}

// toLua converts decoded JSON into Lua values the way Argo CD's decodeValue does: objects and
// arrays become tables (arrays 1-based), numbers LNumber, null nil.
func toLua(l *lua.LState, v interface{}) lua.LValue {
	switch x := v.(type) {
	case map[string]interface{}:
		t := l.NewTable()
		for k, e := range x {
			t.RawSetString(k, toLua(l, e))
		}
		return t
	case []interface{}:
		t := l.NewTable()
		for i, e := range x {
			t.RawSetInt(i+1, toLua(l, e))
		}
		return t
	case string:
		return lua.LString(x)
	case bool:
		return lua.LBool(x)
	case float64:
		return lua.LNumber(x)
	case int64:
		return lua.LNumber(x)
	case int:
		return lua.LNumber(x)
	case nil:
		return lua.LNil
	}
	return lua.LString(fmt.Sprint(v))
}

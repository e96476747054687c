// Package k8s_test checks every YAML file under deploy/ so a typo fails CI:
// each Kubernetes document has apiVersion, kind and metadata.name; the
// kustomization lists files that exist; every image is one that
// deploy/images/build.sh builds; every AGORA_ variable is one a service
// reads; secret and config references resolve; the KEDA ScaledObject
// scales the worker Deployment on the workers consumer.
package k8s_test

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const deployDir = ".."

type doc struct {
	file string
	m    map[string]any
}

// str walks m along path and returns the string there.
func str(m any, path ...string) string {
	s, _ := get(m, path...).(string)
	return s
}

// get walks m along path and returns what is there (nil when the path
// does not exist).
func get(m any, path ...string) any {
	for _, p := range path {
		mm, ok := m.(map[string]any)
		if !ok {
			return nil
		}
		m = mm[p]
	}
	return m
}

func list(v any) []any { l, _ := v.([]any); return l }

// load parses every YAML document under deploy/ but the Prometheus rules
// of deploy/observability (checked by that package's own test).
func load(t *testing.T) (k8s []doc, compose map[string]any) {
	t.Helper()
	err := filepath.WalkDir(deployDir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && path == filepath.Join(deployDir, "observability") {
			return filepath.SkipDir
		}
		if err != nil || d.IsDir() || (filepath.Ext(path) != ".yaml" && filepath.Ext(path) != ".yml") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(deployDir, path)
		for i, part := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
			if strings.TrimSpace(stripComments(part)) == "" {
				continue
			}
			var m map[string]any
			if err := yaml.Unmarshal([]byte(part), &m); err != nil {
				t.Errorf("%s document %d: %v", rel, i, err)
				continue
			}
			if rel == "compose.yaml" {
				compose = m
				continue
			}
			k8s = append(k8s, doc{rel, m})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if compose == nil || len(k8s) == 0 {
		t.Fatalf("found %d Kubernetes documents and compose %v", len(k8s), compose != nil)
	}
	return k8s, compose
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// containers returns the containers of a workload document.
func containers(d doc) []any {
	spec := get(d.m, "spec", "template", "spec")
	if spec == nil { // CronJob-style nesting is not used
		return nil
	}
	return append(list(get(spec, "initContainers")), list(get(spec, "containers"))...)
}

func TestDocumentsAreNamed(t *testing.T) {
	k8s, compose := load(t)
	for _, d := range k8s {
		kind := str(d.m, "kind")
		if str(d.m, "apiVersion") == "" || kind == "" {
			t.Errorf("%s: a document without apiVersion or kind", d.file)
		}
		if kind != "Kustomization" && str(d.m, "metadata", "name") == "" {
			t.Errorf("%s: %s without metadata.name", d.file, kind)
		}
	}
	if len(get(compose, "services").(map[string]any)) == 0 {
		t.Error("compose.yaml has no services")
	}
}

func TestKustomizationFilesExist(t *testing.T) {
	k8s, _ := load(t)
	var seen bool
	for _, d := range k8s {
		if str(d.m, "kind") != "Kustomization" {
			continue
		}
		seen = true
		dir := filepath.Join(deployDir, filepath.Dir(d.file))
		res := list(get(d.m, "resources"))
		if len(res) == 0 {
			t.Errorf("%s lists no resources", d.file)
		}
		for _, r := range res {
			if _, err := os.Stat(filepath.Join(dir, r.(string))); err != nil {
				t.Errorf("%s: resource %v: %v", d.file, r, err)
			}
		}
	}
	if !seen {
		t.Error("no kustomization.yaml under deploy/")
	}
}

// builtImages reads the names deploy/images/build.sh builds and checks a
// Dockerfile exists for each.
func builtImages(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deployDir, "images", "build.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^for name in ([a-z0-9 -]+); do`).FindSubmatch(b)
	if m == nil {
		t.Fatal("build.sh: no `for name in …; do` loop")
	}
	names := strings.Fields(string(m[1]))
	for _, n := range names {
		df, err := os.ReadFile(filepath.Join(deployDir, "images", n+".Dockerfile"))
		if err != nil {
			t.Errorf("image %s: %v", n, err)
			continue
		}
		if !bytes.Contains(df, []byte("\nFROM scratch\n")) || bytes.Contains(df, []byte("# syntax=")) {
			t.Errorf("%s.Dockerfile: want FROM scratch and no # syntax= line", n)
		}
	}
	return names
}

func TestImagesAreBuilt(t *testing.T) {
	names := builtImages(t)
	k8s, compose := load(t)
	check := func(where, image string) {
		t.Helper()
		name, tag, ok := strings.Cut(strings.TrimPrefix(image, "agora/"), ":")
		if !strings.HasPrefix(image, "agora/") || !ok || tag == "" || !slices.Contains(names, name) {
			t.Errorf("%s: image %q is not one deploy/images/build.sh builds (agora/<%s>:<tag>)", where, image, strings.Join(names, "|"))
		}
	}
	var n int
	for _, d := range k8s {
		for _, c := range containers(d) {
			check(d.file+" "+str(d.m, "metadata", "name"), str(c, "image"))
			n++
		}
	}
	for name, svc := range get(compose, "services").(map[string]any) {
		check("compose.yaml "+name, str(svc, "image"))
		n++
	}
	if n < 10 {
		t.Errorf("checked only %d images", n)
	}
}

// knownVars reads the envconfig tags of every command's settings.
func knownVars(t *testing.T) map[string]bool {
	t.Helper()
	// internal/svc reads what every service's connection takes
	// (InboxPrefixVar = "AGORA_…").
	files := []string{"../provision/main.go", "../../internal/svc/svc.go"}
	for _, g := range []string{"../../services/*/config.go", "../../answerers/*/config.go", "../../answerers/*/cmd/*/main.go", "../../services/*/cmd/*/main.go"} {
		m, err := filepath.Glob(g)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	re := regexp.MustCompile("envconfig:\"([A-Z0-9_]+)\"")
	varRE := regexp.MustCompile(`Var = "(AGORA_[A-Z0-9_]+)"`)
	known := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllSubmatch(b, -1) {
			known["AGORA_"+string(m[1])] = true
		}
		for _, m := range varRE.FindAllSubmatch(b, -1) {
			known[string(m[1])] = true
		}
	}
	for _, v := range []string{"AGORA_NATS_URL", "AGORA_WORKER_CONCURRENCY", "AGORA_INBOX_DEV_TOKEN", "AGORA_PROVISION_REPLICAS"} {
		if !known[v] {
			t.Fatalf("reading envconfig tags: %s not found; the test's file list is stale", v)
		}
	}
	return known
}

func TestAgoraVariablesAreRead(t *testing.T) {
	known := knownVars(t)
	k8s, compose := load(t)
	check := func(where, name string) {
		t.Helper()
		if strings.HasPrefix(name, "AGORA_") && !known[name] {
			t.Errorf("%s: %s is read by no service", where, name)
		}
	}
	var n int
	for _, d := range k8s {
		if str(d.m, "kind") == "ConfigMap" {
			for k := range get(d.m, "data").(map[string]any) {
				check(d.file, k)
				n++
			}
		}
		for _, c := range containers(d) {
			for _, e := range list(get(c, "env")) {
				check(d.file, str(e, "name"))
				n++
			}
		}
	}
	for name, svc := range get(compose, "services").(map[string]any) {
		for k := range get(svc, "environment").(map[string]any) {
			check("compose.yaml "+name, k)
			n++
		}
	}
	if n < 10 {
		t.Errorf("checked only %d variables", n)
	}
}

// TestReferencesResolve: secretKeyRef, configMapRef and secret volumes name
// objects (and keys) the base defines.
func TestReferencesResolve(t *testing.T) {
	k8s, _ := load(t)
	secrets, configs := map[string]map[string]any{}, map[string]bool{}
	for _, d := range k8s {
		switch str(d.m, "kind") {
		case "Secret":
			secrets[str(d.m, "metadata", "name")], _ = get(d.m, "stringData").(map[string]any)
		case "ConfigMap":
			configs[str(d.m, "metadata", "name")] = true
		}
	}
	for _, d := range k8s {
		for _, c := range containers(d) {
			for _, e := range list(get(c, "env")) {
				if ref := get(e, "valueFrom", "secretKeyRef"); ref != nil {
					keys, ok := secrets[str(ref, "name")]
					if _, has := keys[str(ref, "key")]; !ok || !has {
						t.Errorf("%s: %s: secret %s key %s is not defined", d.file, str(e, "name"), str(ref, "name"), str(ref, "key"))
					}
				}
			}
			for _, e := range list(get(c, "envFrom")) {
				if n := str(e, "configMapRef", "name"); n != "" && !configs[n] {
					t.Errorf("%s: configMap %s is not defined", d.file, n)
				}
			}
		}
		for _, v := range list(get(d.m, "spec", "template", "spec", "volumes")) {
			if n := str(v, "secret", "secretName"); n != "" && secrets[n] == nil {
				t.Errorf("%s: volume secret %s is not defined", d.file, n)
			}
		}
	}
}

func TestScaledObjectTargetsWorkers(t *testing.T) {
	k8s, _ := load(t)
	deployments := map[string]bool{}
	var so []doc
	for _, d := range k8s {
		switch str(d.m, "kind") {
		case "Deployment":
			deployments[str(d.m, "metadata", "name")] = true
		case "ScaledObject":
			so = append(so, d)
		}
	}
	if len(so) != 1 {
		t.Fatalf("%d ScaledObjects, want 1", len(so))
	}
	d := so[0]
	target := str(d.m, "spec", "scaleTargetRef", "name")
	if target != "worker" || !deployments[target] {
		t.Errorf("ScaledObject targets %q; want the worker Deployment", target)
	}
	if k := str(d.m, "spec", "scaleTargetRef", "kind"); k != "" && k != "Deployment" {
		t.Errorf("ScaledObject target kind %q", k)
	}
	triggers := list(get(d.m, "spec", "triggers"))
	if len(triggers) != 1 || str(triggers[0], "type") != "nats-jetstream" {
		t.Fatalf("triggers = %v, want one nats-jetstream", triggers)
	}
	md := get(triggers[0], "metadata")
	if str(md, "stream") != "AGORA_DISPATCH" || str(md, "consumer") != "workers" || str(md, "lagThreshold") == "" ||
		str(md, "natsServerMonitoringEndpoint") == "" || str(md, "account") != "AGORA" {
		t.Errorf("trigger metadata = %v", md)
	}
}

func TestOnceJobRunsOneDispatch(t *testing.T) {
	k8s, _ := load(t)
	for _, d := range k8s {
		if str(d.m, "kind") == "Job" && str(d.m, "metadata", "name") == "worker-once" {
			c := containers(d)
			if len(c) != 1 || str(c[0], "image") != "agora/worker:dev" || !slices.Contains(list(get(c[0], "args")), any("--once")) {
				t.Errorf("worker-once job containers = %v", c)
			}
			return
		}
	}
	t.Error("no worker-once Job template")
}

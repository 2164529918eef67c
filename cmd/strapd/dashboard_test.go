package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// detailRowMarker names the dashboard row whose panels read the per-session series, which
// exist only with serve --http-metrics-detail.
const detailRowMarker = "--http-metrics-detail"

// dashTarget is one query of the shipped Grafana dashboard with the panel and row it is in.
type dashTarget struct {
	Panel, Row string
	Expr       string
	// Detail: in the row of per-session series (serve --http-metrics-detail).
	Detail bool
}

type dashboard struct {
	Templating struct {
		List []struct {
			Name     string `json:"name"`
			Type     string `json:"type"`
			AllValue string `json:"allValue"`
			Query    any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy/grafana/strapd.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("deploy/grafana/strapd.json: %v", err)
	}
	return d
}

// dashboardTargets lists every query of the shipped dashboard, in panel order; a panel
// belongs to the row above it.
func dashboardTargets(t *testing.T) []dashTarget {
	t.Helper()
	var out []dashTarget
	row := ""
	for _, p := range readDashboard(t).Panels {
		if p.Type == "row" {
			row = p.Title
			continue
		}
		if p.Type != "text" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			out = append(out, dashTarget{Panel: p.Title, Row: row, Expr: tg.Expr, Detail: strings.Contains(row, detailRowMarker)})
		}
	}
	return out
}

// resolveVars puts values in for the dashboard's variables, as Grafana does before a query.
func resolveVars(expr, host, rank string) string {
	return strings.NewReplacer("$host", host, "$rank", rank).Replace(expr)
}

// grafanaValue is one chosen value of a variable as Grafana writes it into a Prometheus
// query for a =~ matcher: regex-escaped, then escaped again for the PromQL string.
func grafanaValue(v string) string {
	return strings.ReplaceAll(regexp.QuoteMeta(v), `\`, `\\`)
}

// selector finds each series selector of strapd's own series (and the process collector's)
// with its label matchers.
var selector = regexp.MustCompile(`(?:^|[^\w:])((?:strapd[_:]|process_)[A-Za-z0-9_:]*)(\{[^}]*\})?`)

// TestDashboardVariables: the dashboard is valid JSON whose host and rank variables exist
// (with ".*" for All, which the Prometheus tests substitute), every series selector of every
// panel is filtered by host (the strapd instance), and every panel of the per-rank row by
// rank too; the per-rank row is the only one reading the per-session series.
func TestDashboardVariables(t *testing.T) {
	d := readDashboard(t)
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.AllValue
	}
	for _, name := range []string{"host", "rank"} {
		if all, ok := vars[name]; !ok || all != ".*" {
			t.Errorf("variable %s: defined %v, allValue %q (want \".*\")", name, ok, all)
		}
	}
	if _, ok := vars["datasource"]; !ok {
		t.Error("no datasource variable")
	}
	targets := dashboardTargets(t)
	var detail int
	for _, tg := range targets {
		for _, v := range regexp.MustCompile(`\$(\w+)`).FindAllStringSubmatch(tg.Expr, -1) {
			if _, ok := vars[v[1]]; !ok {
				t.Errorf("panel %q: $%s is not a dashboard variable: %s", tg.Panel, v[1], tg.Expr)
			}
		}
		sels := selector.FindAllStringSubmatch(tg.Expr, -1)
		if len(sels) == 0 {
			t.Errorf("panel %q: no strapd series in %s", tg.Panel, tg.Expr)
		}
		for _, s := range sels {
			if !strings.Contains(s[2], `instance=~"$host"`) {
				t.Errorf("panel %q: %s%s is not filtered by host", tg.Panel, s[1], s[2])
			}
			perSession := strings.HasPrefix(s[1], "strapd_session_")
			if perSession != tg.Detail {
				t.Errorf("panel %q (row %q): %s: per-session series belong in the %s row, and only there", tg.Panel, tg.Row, s[1], detailRowMarker)
			}
			if tg.Detail && !strings.Contains(s[2], `rank=~"$rank"`) {
				t.Errorf("panel %q: %s%s is not filtered by rank", tg.Panel, s[1], s[2])
			}
		}
		if tg.Detail {
			detail++
		}
	}
	if detail < 4 || len(targets)-detail < 20 {
		t.Fatalf("%d per-rank and %d other queries in the dashboard", detail, len(targets)-detail)
	}
}

package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Series is one line of a chart.
type Series struct {
	Name string
	X, Y []float64
}

// Chart is a line chart with linear axes starting at zero.
type Chart struct {
	Title, XLabel, YLabel string
	Series                []Series
	Steps                 bool // draw as a step function (a CDF)
}

var palette = []color.RGBA{
	{0xd6, 0x27, 0x28, 0xff}, // kube-proxy: red
	{0x1f, 0x77, 0xb4, 0xff}, // edgeproxy: blue
	{0x2c, 0xa0, 0x2c, 0xff}, // edgeproxy+wasm: green
	{0x94, 0x67, 0xbd, 0xff}, // kube-proxy-nftables: purple
	{0xff, 0x7f, 0x0e, 0xff}, // edgeproxy-nftables: orange
	{0x8c, 0x56, 0x4b, 0xff},
}

const chartW, chartH = 800, 480

// colorOf keeps a proxy's color the same in every chart.
func colorOf(name string, i int) color.RGBA {
	for k, kind := range []ProxyKind{KubeProxy, EdgeProxy, EdgeProxyWasm, KubeProxyNFT, EdgeProxyNFT} {
		if name == string(kind) {
			return palette[k]
		}
	}
	return palette[(5+i)%len(palette)]
}

// WritePNG renders the chart.
func (c *Chart) WritePNG(path string) error {
	img := image.NewRGBA(image.Rect(0, 0, chartW, chartH))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	left, right, top, bottom := 80, chartW-20, 40, chartH-60
	var xmax, ymax float64
	for _, s := range c.Series {
		for i := range s.X {
			if !math.IsNaN(s.X[i]) && !math.IsNaN(s.Y[i]) {
				xmax, ymax = max(xmax, s.X[i]), max(ymax, s.Y[i])
			}
		}
	}
	xmax, ymax = niceMax(xmax), niceMax(ymax)
	px := func(x float64) int { return left + int(float64(right-left)*x/xmax) }
	py := func(y float64) int { return bottom - int(float64(bottom-top)*y/ymax) }
	grey := color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	black := color.RGBA{0, 0, 0, 0xff}
	for i := 0; i <= 5; i++ {
		y := ymax * float64(i) / 5
		line(img, left, py(y), right, py(y), grey)
		text(img, 8, py(y)+4, tick(y), black)
		x := xmax * float64(i) / 5
		line(img, px(x), top, px(x), bottom, grey)
		text(img, px(x)-12, bottom+18, tick(x), black)
	}
	line(img, left, bottom, right, bottom, black)
	line(img, left, top, left, bottom, black)
	text(img, left, 14, c.Title, black)
	text(img, (left+right)/2-len(c.XLabel)*3, chartH-18, c.XLabel, black)
	text(img, 8, top-6, c.YLabel, black)
	for si, s := range c.Series {
		col := colorOf(s.Name, si)
		var prevX, prevY int
		first := true
		for i := range s.X {
			if math.IsNaN(s.X[i]) || math.IsNaN(s.Y[i]) {
				continue
			}
			x, y := px(s.X[i]), py(s.Y[i])
			if !first {
				if c.Steps {
					thick(img, prevX, prevY, x, prevY, col)
					thick(img, x, prevY, x, y, col)
				} else {
					thick(img, prevX, prevY, x, y, col)
				}
			}
			if !c.Steps {
				for dx := -3; dx <= 3; dx++ {
					for dy := -3; dy <= 3; dy++ {
						img.Set(x+dx, y+dy, col)
					}
				}
			}
			prevX, prevY, first = x, y, false
		}
		ly := top + 10 + 18*si
		thick(img, right-190, ly-4, right-165, ly-4, col)
		text(img, right-158, ly, s.Name, black)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// niceMax rounds v up to 1, 2 or 5 × 10^k (at least a small positive value).
func niceMax(v float64) float64 {
	if v <= 0 || math.IsNaN(v) {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*e {
			return m * e
		}
	}
	return 10 * e
}

func tick(v float64) string {
	switch {
	case v == math.Trunc(v) && math.Abs(v) < 1e6:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 0.1:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

func text(img draw.Image, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13,
		Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for {
		img.Set(x0, y0, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func thick(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	line(img, x0, y0, x1, y1, c)
	line(img, x0, y0+1, x1, y1+1, c)
	line(img, x0+1, y0, x1+1, y1, c)
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func sign(v int) int {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}

// cdf turns samples into a step CDF in milliseconds.
func cdf(xs []float64) (x, y []float64) {
	s := slices.Clone(xs)
	slices.Sort(s)
	x, y = append(x, 0), append(y, 0)
	for i, v := range s {
		x = append(x, v*1000)
		y = append(y, float64(i+1)/float64(len(s)))
	}
	return x, y
}

// Charts writes the report's charts into dir and returns their file names.
func (rep *Report) Charts(dir string) ([]string, error) {
	var names []string
	add := func(name string, c *Chart) error {
		if len(c.Series) == 0 {
			return nil
		}
		names = append(names, name)
		return c.WritePNG(filepath.Join(dir, name))
	}
	for _, backend := range rep.Plan.Backends {
		largest := 0
		for _, n := range rep.Plan.Sizes {
			if r := find(rep.Results, EdgeProxy, backend, n); r != nil && len(r.Flips) > 0 {
				largest = n
			}
		}
		lat := &Chart{Title: fmt.Sprintf("S2 one change, API write -> kernel, %d services, iptables-%s", largest, backend),
			XLabel: "latency (ms)", YLabel: "fraction of changes", Steps: true}
		cold := &Chart{Title: "S1 cold start, iptables-" + backend, XLabel: "services", YLabel: "seconds"}
		rss := &Chart{Title: "S5 steady RSS, iptables-" + backend, XLabel: "services", YLabel: "MiB"}
		for _, kind := range rep.Plan.Proxies {
			if r := find(rep.Results, kind, backend, largest); r != nil && len(r.Flips) > 0 {
				x, y := cdf(r.Flips)
				lat.Series = append(lat.Series, Series{Name: string(kind), X: x, Y: y})
			}
			var cs, rs Series
			cs.Name, rs.Name = string(kind), string(kind)
			for _, n := range rep.Plan.Sizes {
				r := find(rep.Results, kind, backend, n)
				if r == nil || r.Error != "" {
					continue
				}
				cs.X, cs.Y = append(cs.X, float64(n)), append(cs.Y, r.ColdStart)
				rs.X, rs.Y = append(rs.X, float64(n)), append(rs.Y, float64(r.SteadyRSS)/(1<<20))
			}
			if len(cs.X) > 0 {
				cold.Series = append(cold.Series, cs)
				rss.Series = append(rss.Series, rs)
			}
		}
		if err := add("latency-cdf-"+backend+".png", lat); err != nil {
			return nil, err
		}
		if err := add("cold-start-"+backend+".png", cold); err != nil {
			return nil, err
		}
		if err := add("rss-"+backend+".png", rss); err != nil {
			return nil, err
		}
		for _, c := range rep.s0Charts(backend) {
			if err := add(c.file, c.Chart); err != nil {
				return nil, err
			}
		}
	}
	return names, nil
}

type namedChart struct {
	file string
	*Chart
}

// s0Charts are the S0 window over time: CPU used and wakeups since its
// start, and RSS.
func (rep *Report) s0Charts(backend string) []namedChart {
	cpu := &Chart{Title: "S0 quiet, CPU since the window's start, iptables-" + backend, XLabel: "seconds", YLabel: "CPU ms"}
	wake := &Chart{Title: "S0 quiet, wakeups since the window's start, iptables-" + backend, XLabel: "seconds", YLabel: "wakeups"}
	rss := &Chart{Title: "S0 quiet, RSS, iptables-" + backend, XLabel: "seconds", YLabel: "MiB"}
	for _, r := range rep.Results {
		if r.Scenario != "S0" || r.Backend != backend || r.Idle == nil {
			continue
		}
		c, w, m := Series{Name: string(r.Proxy)}, Series{Name: string(r.Proxy)}, Series{Name: string(r.Proxy)}
		for _, s := range r.Idle.Trace {
			c.X, c.Y = append(c.X, s.T), append(c.Y, s.CPU*1000)
			w.X, w.Y = append(w.X, s.T), append(w.Y, float64(s.Wakeups))
			m.X, m.Y = append(m.X, s.T), append(m.Y, float64(s.RSS)/(1<<20))
		}
		cpu.Series, wake.Series, rss.Series = append(cpu.Series, c), append(wake.Series, w), append(rss.Series, m)
	}
	return []namedChart{{"s0-cpu-" + backend + ".png", cpu}, {"s0-wakeups-" + backend + ".png", wake}, {"s0-rss-" + backend + ".png", rss}}
}

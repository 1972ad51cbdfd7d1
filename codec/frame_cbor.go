package codec

import (
	"bytes"
	"encoding"
	"encoding/binary"
	"math"
	"reflect"
	"slices"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/fxamacker/cbor/v2"
)

// Frames are encoded on every flush, and an op has some fifty attributes,
// almost all absent: the generic encoder spends most of its time looking
// at fields it leaves out. frameEncoder writes the same bytes (core
// deterministic CBOR, as encMode does) from a table of the struct's fields
// built once by reflection, reading each field in place. A struct with a
// field of a kind it does not know gets no table, and Marshal uses encMode.

// Frames are decoded on every frame a worker runs, and the same table
// decodes them in one pass (decodeFrame) when they are what a client
// writes: definite lengths, the fields' exact keys, each once, values of
// the fields' own CBOR types, finite floats. Anything else (an unknown or
// repeated key, a null, a tag, a NaN, a value of another type, trailing
// bytes, bad UTF-8) makes it give up, and DecodeFrame decodes the frame with
// decMode, which accepts or refuses it with its own rules and messages.
// What the table decodes, decMode decodes to the same value.

// fieldKind is a field type the frame encoder knows.
type fieldKind uint8

const (
	kindString fieldKind = iota + 1
	kindBool
	kindInt
	kindUint64
	kindFloat64
	kindBytes
	kindInts
	kindUint64s
	kindFloat64s
	kindStructs   // a slice of a struct with its own table
	kindStructPtr // a pointer to a struct with its own table
)

type fieldCodec struct {
	key       []byte // the encoded key
	off       uintptr
	kind      fieldKind
	omitEmpty bool
	elem      *structCodec // kindStructs, kindStructPtr
	typ       reflect.Type // kindStructs: the slice type; kindStructPtr: the struct type
}

// structCodec is a struct's fields in the order core deterministic
// encoding sorts their keys.
type structCodec struct {
	size   uintptr
	fields []fieldCodec
	byKey  map[string]int // index in fields
}

// frameCodec and resultCodec are nil when Frame or Result (or a struct in
// them) has a field the table cannot encode.
var (
	frameCodec  = newStructCodec(reflect.TypeFor[Frame]())
	resultCodec = newStructCodec(reflect.TypeFor[Result]())
)

// Types that encode themselves: the table leaves their structs to encMode.
var selfEncoding = []reflect.Type{
	reflect.TypeFor[cbor.Marshaler](), reflect.TypeFor[cbor.Unmarshaler](),
	reflect.TypeFor[encoding.BinaryMarshaler](), reflect.TypeFor[encoding.BinaryUnmarshaler](),
	reflect.TypeFor[encoding.TextMarshaler](), reflect.TypeFor[encoding.TextUnmarshaler](),
}

func newStructCodec(t reflect.Type) *structCodec {
	for _, i := range selfEncoding {
		if reflect.PointerTo(t).Implements(i) {
			return nil
		}
	}
	sc := &structCodec{size: t.Size()}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("cbor")
		if tag == "-" || !f.IsExported() {
			continue
		}
		if f.Anonymous {
			return nil
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = f.Name
		}
		fc := fieldCodec{off: f.Offset}
		for _, o := range strings.Split(opts, ",") {
			switch o {
			case "omitempty":
				fc.omitEmpty = true
			case "":
			default:
				return nil // toarray, keyasint, omitzero...
			}
		}
		fc.key = appendText(nil, name)
		switch f.Type {
		case reflect.TypeFor[string]():
			fc.kind = kindString
		case reflect.TypeFor[bool]():
			fc.kind = kindBool
		case reflect.TypeFor[int]():
			fc.kind = kindInt
		case reflect.TypeFor[uint64]():
			fc.kind = kindUint64
		case reflect.TypeFor[float64]():
			fc.kind = kindFloat64
		case reflect.TypeFor[[]byte]():
			fc.kind = kindBytes
		case reflect.TypeFor[[]int]():
			fc.kind = kindInts
		case reflect.TypeFor[[]uint64]():
			fc.kind = kindUint64s
		case reflect.TypeFor[[]float64]():
			fc.kind = kindFloat64s
		default:
			k := f.Type.Kind()
			if k != reflect.Slice && k != reflect.Pointer || f.Type.Elem().Kind() != reflect.Struct || f.Type.Elem() == t {
				return nil
			}
			if fc.elem = newStructCodec(f.Type.Elem()); fc.elem == nil {
				return nil
			}
			fc.kind, fc.typ = kindStructs, f.Type
			if k == reflect.Pointer {
				fc.kind, fc.typ = kindStructPtr, f.Type.Elem()
			}
		}
		sc.fields = append(sc.fields, fc)
	}
	slices.SortFunc(sc.fields, func(a, b fieldCodec) int { return bytes.Compare(a.key, b.key) })
	if len(sc.fields) > 64 {
		return nil // decodeStruct marks the keys seen in a uint64
	}
	sc.byKey = make(map[string]int, len(sc.fields))
	for i, f := range sc.fields {
		sc.byKey[string(f.key[len(f.key)-textLen(f.key):])] = i
	}
	return sc
}

// textLen is the length of the text string encoded in key.
func textLen(key []byte) int {
	d := fastDecoder{b: key}
	_, n, _ := d.head()
	return int(n)
}

// appendStruct encodes the struct at p.
func (sc *structCodec) appendStruct(b []byte, p unsafe.Pointer) []byte {
	// The map's head counts the fields written: one byte under 24,
	// written when they are.
	start := len(b)
	b = append(b, 0)
	n := 0
	for i := range sc.fields {
		f := &sc.fields[i]
		fp := unsafe.Add(p, f.off)
		if f.omitEmpty && f.empty(fp) {
			continue
		}
		n++
		b = append(b, f.key...)
		b = f.appendValue(b, fp)
	}
	head := appendHead(make([]byte, 0, 9), 5, uint64(n))
	b[start] = head[0]
	return slices.Insert(b, start+1, head[1:]...)
}

func (f *fieldCodec) empty(p unsafe.Pointer) bool {
	switch f.kind {
	case kindString:
		return len(*(*string)(p)) == 0
	case kindBool:
		return !*(*bool)(p)
	case kindInt:
		return *(*int)(p) == 0
	case kindUint64:
		return *(*uint64)(p) == 0
	case kindFloat64:
		return *(*float64)(p) == 0
	case kindStructPtr:
		return *(*unsafe.Pointer)(p) == nil
	}
	// Every slice header starts with its pointer and its length.
	return (*struct {
		_ unsafe.Pointer
		n int
	})(p).n == 0
}

func (f *fieldCodec) appendValue(b []byte, p unsafe.Pointer) []byte {
	switch f.kind {
	case kindString:
		return appendText(b, *(*string)(p))
	case kindBool:
		if *(*bool)(p) {
			return append(b, 0xf5)
		}
		return append(b, 0xf4)
	case kindInt:
		return appendInt(b, int64(*(*int)(p)))
	case kindUint64:
		return appendHead(b, 0, *(*uint64)(p))
	case kindFloat64:
		return appendFloat(b, *(*float64)(p))
	case kindBytes:
		v := *(*[]byte)(p)
		if v == nil {
			return append(b, 0xf6)
		}
		return append(appendHead(b, 2, uint64(len(v))), v...)
	case kindInts:
		v := *(*[]int)(p)
		if v == nil {
			return append(b, 0xf6)
		}
		b = appendHead(b, 4, uint64(len(v)))
		for _, x := range v {
			b = appendInt(b, int64(x))
		}
		return b
	case kindUint64s:
		v := *(*[]uint64)(p)
		if v == nil {
			return append(b, 0xf6)
		}
		b = appendHead(b, 4, uint64(len(v)))
		for _, x := range v {
			b = appendHead(b, 0, x)
		}
		return b
	case kindFloat64s:
		v := *(*[]float64)(p)
		if v == nil {
			return append(b, 0xf6)
		}
		b = appendHead(b, 4, uint64(len(v)))
		for _, x := range v {
			b = appendFloat(b, x)
		}
		return b
	}
	if f.kind == kindStructPtr {
		v := *(*unsafe.Pointer)(p)
		if v == nil {
			return append(b, 0xf6)
		}
		return f.elem.appendStruct(b, v)
	}
	// kindStructs
	h := (*struct {
		data unsafe.Pointer
		n    int
	})(p)
	if h.data == nil {
		return append(b, 0xf6)
	}
	b = appendHead(b, 4, uint64(h.n))
	for i := range h.n {
		b = f.elem.appendStruct(b, unsafe.Add(h.data, uintptr(i)*f.elem.size))
	}
	return b
}

// appendHead writes a data item's head: major type and argument, in the
// shortest form.
func appendHead(b []byte, major byte, v uint64) []byte {
	m := major << 5
	switch {
	case v < 24:
		return append(b, m|byte(v))
	case v <= math.MaxUint8:
		return append(b, m|24, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, m|25), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, m|26), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, m|27), v)
}

func appendInt(b []byte, v int64) []byte {
	if v >= 0 {
		return appendHead(b, 0, uint64(v))
	}
	return appendHead(b, 1, uint64(-(v + 1)))
}

func appendText(b []byte, s string) []byte {
	return append(appendHead(b, 3, uint64(len(s))), s...)
}

// appendFloat writes f in the shortest of half, single and double
// precision that holds it exactly; NaN as the half 0x7e00 and infinities
// as halves, as core deterministic encoding does.
func appendFloat(b []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(b, 0xf9, 0x7e, 0x00)
	case math.IsInf(f, 1):
		return append(b, 0xf9, 0x7c, 0x00)
	case math.IsInf(f, -1):
		return append(b, 0xf9, 0xfc, 0x00)
	}
	f32 := float32(f)
	if float64(f32) != f {
		return binary.BigEndian.AppendUint64(append(b, 0xfb), math.Float64bits(f))
	}
	if h, ok := half(f32); ok {
		return binary.BigEndian.AppendUint16(append(b, 0xf9), h)
	}
	return binary.BigEndian.AppendUint32(append(b, 0xfa), math.Float32bits(f32))
}

// half returns the IEEE binary16 bits of a finite f if f is exactly one.
func half(f float32) (uint16, bool) {
	bits := math.Float32bits(f)
	sign := uint16(bits>>16) & 0x8000
	exp := int(bits>>23) & 0xff
	man := bits & 0x7fffff
	switch {
	case exp == 0 && man == 0:
		return sign, true // ±0
	case exp == 0:
		return 0, false // single subnormals are far below half's range
	}
	e := exp - 127
	switch {
	case e >= -14 && e <= 15:
		if man&0x1fff != 0 {
			return 0, false
		}
		return sign | uint16(e+15)<<10 | uint16(man>>13), true
	case e >= -24 && e < -14:
		// A half subnormal: m * 2^-24 with m < 1024.
		full := man | 0x800000
		shift := uint(-(e + 1))
		if full&(1<<shift-1) != 0 {
			return 0, false
		}
		return sign | uint16(full>>shift), true
	}
	return 0, false
}

// decodeFrame decodes data with the table, or reports false.
func decodeFrameInto(data []byte, f *Frame) bool {
	if frameCodec == nil {
		return false
	}
	d := fastDecoder{b: data}
	return d.decodeStruct(frameCodec, unsafe.Pointer(f)) && d.i == len(d.b)
}

type fastDecoder struct {
	b []byte
	i int
}

// head reads a data item's head: major type and argument (for major 7,
// the simple value or the float's bits). It refuses indefinite lengths.
func (d *fastDecoder) head() (major byte, arg uint64, ok bool) {
	if d.i >= len(d.b) {
		return 0, 0, false
	}
	c := d.b[d.i]
	d.i++
	major, ai := c>>5, c&31
	var n int
	switch {
	case ai < 24:
		return major, uint64(ai), true
	case ai == 24:
		n = 1
	case ai == 25:
		n = 2
	case ai == 26:
		n = 4
	case ai == 27:
		n = 8
	default:
		return 0, 0, false
	}
	if len(d.b)-d.i < n {
		return 0, 0, false
	}
	for _, x := range d.b[d.i : d.i+n] {
		arg = arg<<8 | uint64(x)
	}
	d.i += n
	return major, arg, true
}

// count reads the head of an array (major 4) or map (5) whose items fit in
// the bytes left, each taking at least one.
func (d *fastDecoder) count(major byte) (int, bool) {
	m, n, ok := d.head()
	if !ok || m != major || n > maxArray || n > uint64(len(d.b)-d.i) {
		return 0, false
	}
	return int(n), true
}

// bytes reads a byte (major 2) or text (3) string's contents.
func (d *fastDecoder) bytes(major byte) ([]byte, bool) {
	m, n, ok := d.head()
	if !ok || m != major || n > uint64(len(d.b)-d.i) {
		return nil, false
	}
	b := d.b[d.i : d.i+int(n)]
	d.i += int(n)
	return b, true
}

func (d *fastDecoder) decodeStruct(sc *structCodec, p unsafe.Pointer) bool {
	n, ok := d.count(5)
	if !ok || n > maxMapPairs {
		return false
	}
	var seen uint64
	for range n {
		key, ok := d.bytes(3)
		if !ok {
			return false
		}
		i, known := sc.byKey[string(key)]
		if !known || seen&(1<<i) != 0 {
			return false
		}
		seen |= 1 << i
		if !d.value(&sc.fields[i], unsafe.Add(p, sc.fields[i].off)) {
			return false
		}
	}
	return true
}

func (d *fastDecoder) value(f *fieldCodec, p unsafe.Pointer) bool {
	if d.i < len(d.b) && d.b[d.i] == 0xf6 {
		// null: a nil slice (the field is zero already); refused elsewhere.
		switch f.kind {
		case kindBytes, kindInts, kindUint64s, kindFloat64s, kindStructs:
			d.i++
			return true
		}
		return false
	}
	switch f.kind {
	case kindString:
		b, ok := d.bytes(3)
		if !ok || !utf8.Valid(b) {
			return false
		}
		*(*string)(p) = string(b)
	case kindBool:
		m, v, ok := d.head()
		if !ok || m != 7 || v != 20 && v != 21 {
			return false
		}
		*(*bool)(p) = v == 21
	case kindInt:
		v, ok := d.int()
		if !ok {
			return false
		}
		*(*int)(p) = v
	case kindUint64:
		m, v, ok := d.head()
		if !ok || m != 0 {
			return false
		}
		*(*uint64)(p) = v
	case kindFloat64:
		v, ok := d.float()
		if !ok {
			return false
		}
		*(*float64)(p) = v
	case kindBytes:
		b, ok := d.bytes(2)
		if !ok {
			return false
		}
		*(*[]byte)(p) = slices.Clone(b)
		if len(b) == 0 {
			*(*[]byte)(p) = []byte{}
		}
	case kindInts:
		n, ok := d.count(4)
		if !ok {
			return false
		}
		v := make([]int, n)
		for i := range v {
			if v[i], ok = d.int(); !ok {
				return false
			}
		}
		*(*[]int)(p) = v
	case kindUint64s:
		n, ok := d.count(4)
		if !ok {
			return false
		}
		v := make([]uint64, n)
		for i := range v {
			m, x, ok := d.head()
			if !ok || m != 0 {
				return false
			}
			v[i] = x
		}
		*(*[]uint64)(p) = v
	case kindFloat64s:
		n, ok := d.count(4)
		if !ok {
			return false
		}
		v := make([]float64, n)
		for i := range v {
			if v[i], ok = d.float(); !ok {
				return false
			}
		}
		*(*[]float64)(p) = v
	case kindStructs:
		n, ok := d.count(4)
		if !ok {
			return false
		}
		// A slice already there with room is reused, zeroed first (every
		// field the item leaves out is zero): a frame decoded into the
		// Frame of the last one reuses its ops.
		v := reflect.NewAt(f.typ, p).Elem()
		if !v.IsNil() && v.Cap() >= n {
			v = v.Slice(0, n)
			v.Clear()
		} else {
			v = reflect.MakeSlice(f.typ, n, n)
		}
		for i := range n {
			if !d.decodeStruct(f.elem, unsafe.Add(v.UnsafePointer(), uintptr(i)*f.elem.size)) {
				return false
			}
		}
		reflect.NewAt(f.typ, p).Elem().Set(v)
	case kindStructPtr:
		v := reflect.New(f.typ)
		if !d.decodeStruct(f.elem, v.UnsafePointer()) {
			return false
		}
		reflect.NewAt(v.Type(), p).Elem().Set(v)
	default:
		return false
	}
	return true
}

func (d *fastDecoder) int() (int, bool) {
	m, v, ok := d.head()
	switch {
	case !ok || v > math.MaxInt:
		return 0, false
	case m == 0:
		return int(v), true
	case m == 1:
		return -1 - int(v), true
	}
	return 0, false
}

// float reads a finite float of any width.
func (d *fastDecoder) float() (float64, bool) {
	if d.i >= len(d.b) {
		return 0, false
	}
	ai := d.b[d.i] & 31
	m, v, ok := d.head()
	if !ok || m != 7 {
		return 0, false
	}
	var f float64
	switch ai {
	case 25:
		f = float64(halfToFloat32(uint16(v)))
	case 26:
		f = float64(math.Float32frombits(uint32(v)))
	case 27:
		f = math.Float64frombits(v)
	default:
		return 0, false
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// halfToFloat32 converts IEEE binary16 bits to the float32 of that value.
func halfToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		// Subnormal (or zero): man * 2^-24, exact in a float32.
		v := float32(man) * (1.0 / (1 << 24))
		return math.Float32frombits(math.Float32bits(v) | sign)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
}

// decodeResult decodes data with the table into r, which must be zero, or
// reports false (r is then left zero).
func decodeResult(data []byte, r *Result) bool {
	if resultCodec == nil {
		return false
	}
	d := fastDecoder{b: data}
	if !d.decodeStruct(resultCodec, unsafe.Pointer(r)) || d.i != len(d.b) {
		*r = Result{}
		return false
	}
	return true
}

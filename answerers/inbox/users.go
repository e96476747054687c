package inbox

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/bcrypt"
)

// User is one entry of the users file (Config.UsersFile), a YAML or JSON
// list of them.
type User struct {
	// Name signs in and becomes the answered_by of this user's answers.
	Name string `yaml:"name" json:"name"`
	// Bcrypt is the bcrypt hash of the password, as made by
	// `htpasswd -nbBC 10 "" 'password' | cut -c2-` or
	// bcrypt.GenerateFromPassword.
	Bcrypt string `yaml:"bcrypt" json:"bcrypt"`
	// Routes are the routes the user may see and answer; empty: every
	// route the inbox shows.
	Routes []string `yaml:"routes,omitempty" json:"routes,omitempty"`
}

// maxNameBytes matches the router's limit on answered_by.
const maxNameBytes = 256

// minBcryptCost is the cost below which a hash is logged as weak.
const minBcryptCost = 10

// user is a signed-in identity: a users-file entry or the dev user.
type user struct {
	name   string
	hash   []byte
	routes []string // empty: all
}

// may reports whether u may see and answer questions on route.
func (u *user) may(route string) bool {
	return len(u.routes) == 0 || slices.Contains(u.routes, route)
}

// LoadUsers reads and checks a users file. The error lists every problem,
// each with the entry it belongs to.
func LoadUsers(path string) ([]User, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("inbox: users file: %w", err)
	}
	return ParseUsers(b)
}

// ParseUsers parses a users file's content (YAML, or JSON, which YAML
// reads too) and checks every entry: a unique, printable name, a valid
// bcrypt hash and valid route names. Unknown fields are errors, so a
// misspelt "bcrypt" is not silently ignored.
func ParseUsers(b []byte) ([]User, error) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var users []User
	if err := dec.Decode(&users); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("inbox: users file: it is empty; want a list of {name, bcrypt, routes}")
		}
		return nil, fmt.Errorf("inbox: users file: want a list of {name, bcrypt, routes}: %w", err)
	}
	if len(users) == 0 {
		return nil, errors.New("inbox: users file: the list is empty")
	}
	var errs []error
	seen := map[string]int{}
	for i, u := range users {
		at := fmt.Sprintf("entry %d", i+1)
		if u.Name != "" {
			at += fmt.Sprintf(" (%s)", u.Name)
		}
		switch {
		case strings.TrimSpace(u.Name) == "":
			errs = append(errs, fmt.Errorf("%s: name is empty", at))
		case u.Name != strings.TrimSpace(u.Name):
			errs = append(errs, fmt.Errorf("%s: name has leading or trailing spaces", at))
		case len(u.Name) > maxNameBytes:
			errs = append(errs, fmt.Errorf("%s: name is longer than %d bytes", at, maxNameBytes))
		case !utf8.ValidString(u.Name) || strings.IndexFunc(u.Name, unicode.IsControl) >= 0:
			errs = append(errs, fmt.Errorf("%s: name must be printable UTF-8 text", at))
		}
		if j, dup := seen[u.Name]; dup && u.Name != "" {
			errs = append(errs, fmt.Errorf("%s: the name is also entry %d", at, j+1))
		}
		seen[u.Name] = i
		if u.Bcrypt == "" {
			errs = append(errs, fmt.Errorf("%s: bcrypt is empty; want the bcrypt hash of the password", at))
		} else if _, err := bcrypt.Cost([]byte(u.Bcrypt)); err != nil {
			errs = append(errs, fmt.Errorf("%s: bcrypt is not a bcrypt hash: %v", at, err))
		}
		for _, r := range u.Routes {
			if !routeRE.MatchString(r) {
				errs = append(errs, fmt.Errorf("%s: route %q: want 1-64 letters, digits, '-' or '_'", at, r))
			}
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("inbox: users file: %w", errors.Join(errs...))
	}
	return users, nil
}

// HashPassword returns the bcrypt hash (cost 10) of password, for the
// users file.
func HashPassword(password string) (string, error) {
	if password == "" {
		return "", errors.New("inbox: the password is empty")
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), minBcryptCost)
	if err != nil {
		return "", fmt.Errorf("inbox: hash password: %w", err)
	}
	return string(h), nil
}

// dummyHash is compared against when the name is unknown, so a wrong name
// costs as much time as a wrong password. It is made on first use.
var dummyHash = sync.OnceValue(func() []byte {
	h, _ := bcrypt.GenerateFromPassword([]byte("agora-inbox-no-such-user"), minBcryptCost)
	return h
})

func bcryptCost(hash string) (int, error) { return bcrypt.Cost([]byte(hash)) }

package sentinel

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Resolve reads the sentinel file of workspace, <workspace>/.agora/needs_input.json,
// and classifies it. The worker calls it once the sub-agent's runtime has
// exited, whatever the exit code. Resolve blocks on file-system I/O only; it
// cannot hang on a FIFO or a device, because it opens nothing but regular
// files and opens those non-blocking.
//
// Resolve never returns a non-nil error for anything the sub-agent controls:
// a missing .agora or file is [Absent]; a symlink (valid or dangling),
// directory, FIFO, socket or device at the path, a .agora that is a symlink
// or not a directory, a file that cannot be read because of its own
// permissions, a file swapped while it is being resolved, or content that
// breaks a rule of [Parse] is [Malformed]; a file larger than [MaxSize] is
// [Oversized]. The error return is for failures the worker must treat as its
// own: the workspace missing or not a directory, permission denied on a
// directory, I/O errors.
//
// Symlinks are never followed. Every open happens relative to a handle on
// the workspace ([os.Root]), so even a .agora swapped for a symlink between
// two checks cannot make Resolve read a file outside the workspace, and each
// object opened is compared with what was checked before reading it.
func Resolve(workspace string) (Resolution, error) {
	ws, err := os.OpenRoot(workspace)
	if err != nil {
		return Resolution{}, fmt.Errorf("sentinel: open workspace: %w", err)
	}
	defer ws.Close()

	dirName, fileName := filepath.Split(filepath.FromSlash(RelPath))
	dirName = filepath.Clean(dirName)

	dir, res, err := openDir(ws, dirName)
	if dir == nil {
		return res, err
	}
	defer dir.Close()
	f, res, err := openFile(dir, fileName)
	if f == nil {
		return res, err
	}
	defer f.Close()
	return readFile(f)
}

// openDir opens the directory dirName of ws, checked to be the directory
// it examined first. When it returns no handle, the Resolution and error
// it returns are Resolve's.
func openDir(ws *os.Root, dirName string) (*os.Root, Resolution, error) {
	dirInfo, err := ws.Lstat(dirName)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Resolution{Status: Absent}, nil
	}
	if err != nil {
		return nil, Resolution{}, fmt.Errorf("sentinel: %w", err)
	}
	if !dirInfo.IsDir() {
		return nil, malformedFile(dirName + " is not a directory (" + typeName(dirInfo.Mode()) + ")"), nil
	}
	dir, err := ws.OpenRoot(dirName)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, Resolution{Status: Absent}, nil
		}
		if changed(ws, dirName, dirInfo) {
			return nil, malformedFile(dirName + " changed while it was resolved"), nil
		}
		return nil, Resolution{}, fmt.Errorf("sentinel: %w", err)
	}
	if opened, err := dir.Stat("."); err != nil {
		dir.Close()
		return nil, Resolution{}, fmt.Errorf("sentinel: %w", err)
	} else if !os.SameFile(dirInfo, opened) {
		dir.Close()
		return nil, malformedFile(dirName + " changed while it was resolved"), nil
	}
	return dir, Resolution{}, nil
}

// openFile opens the regular file fileName of dir, checked to be the file
// it examined first and no larger than MaxSize. When it returns no file,
// the Resolution and error it returns are Resolve's.
func openFile(dir *os.Root, fileName string) (*os.File, Resolution, error) {
	info, err := dir.Lstat(fileName)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Resolution{Status: Absent}, nil
	}
	if err != nil {
		return nil, Resolution{}, fmt.Errorf("sentinel: %w", err)
	}
	if !info.Mode().IsRegular() {
		return nil, malformedFile("not a regular file (" + typeName(info.Mode()) + ")"), nil
	}
	if info.Size() > MaxSize {
		return nil, oversized(info.Size()), nil
	}

	f, err := dir.OpenFile(fileName, openFlags, 0)
	if err != nil {
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil, Resolution{Status: Absent}, nil
		case errors.Is(err, fs.ErrPermission):
			return nil, malformedFile("not readable (permission denied)"), nil
		case changed(dir, fileName, info):
			return nil, malformedFile("changed while it was resolved"), nil
		}
		return nil, Resolution{}, fmt.Errorf("sentinel: %w", err)
	}
	if res, ok, err := checkOpened(f, info); !ok {
		f.Close()
		return nil, res, err
	}
	return f, Resolution{}, nil
}

// checkOpened checks that the opened file f is still the regular file
// described by info and no larger than MaxSize. When it is not, the
// Resolution and error it returns are Resolve's.
func checkOpened(f *os.File, info fs.FileInfo) (Resolution, bool, error) {
	opened, err := f.Stat()
	if err != nil {
		return Resolution{}, false, fmt.Errorf("sentinel: %w", err)
	}
	if !opened.Mode().IsRegular() {
		return malformedFile("not a regular file (" + typeName(opened.Mode()) + ")"), false, nil
	}
	if !os.SameFile(info, opened) {
		return malformedFile("changed while it was resolved"), false, nil
	}
	if opened.Size() > MaxSize {
		return oversized(opened.Size()), false, nil
	}
	return Resolution{}, true, nil
}

// readFile reads at most MaxSize bytes of f and parses them.
func readFile(f *os.File) (Resolution, error) {
	b, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return Resolution{}, fmt.Errorf("sentinel: read: %w", err)
	}
	if len(b) > MaxSize {
		return oversized(MaxSize + 1), nil
	}
	req, err := Parse(b)
	if err != nil {
		return Resolution{Status: Malformed, Size: int64(len(b)), Err: err}, nil
	}
	return Resolution{Status: Valid, Request: req, Size: int64(len(b))}, nil
}

// changed reports whether name in root is no longer the object described
// by before, or can no longer be examined.
func changed(root *os.Root, name string, before fs.FileInfo) bool {
	now, err := root.Lstat(name)
	return err != nil || !os.SameFile(before, now) || now.Mode().Type() != before.Mode().Type()
}

// malformedFile is the Resolution for a problem with the file as a whole.
func malformedFile(reason string) Resolution {
	return Resolution{Status: Malformed, Err: &MalformedError{Reason: reason}}
}

// oversized is the Resolution for a file of size bytes, more than MaxSize.
func oversized(size int64) Resolution {
	return Resolution{Status: Oversized, Size: size, Err: &OversizedError{Size: size, Limit: MaxSize}}
}

// typeName names the file type in mode for error messages.
func typeName(mode fs.FileMode) string {
	switch {
	case mode.IsRegular():
		return "regular file"
	case mode&fs.ModeSymlink != 0:
		return "symlink"
	case mode.IsDir():
		return "directory"
	case mode&fs.ModeNamedPipe != 0:
		return "fifo"
	case mode&fs.ModeSocket != 0:
		return "socket"
	case mode&fs.ModeCharDevice != 0:
		return "character device"
	case mode&fs.ModeDevice != 0:
		return "device"
	}
	return "irregular file"
}

CREATE TABLE teachers (
  id INTEGER PRIMARY KEY,
  name TEXT,
  department TEXT,
  hired_year INTEGER
);
CREATE TABLE courses (
  id INTEGER PRIMARY KEY,
  title TEXT,
  teacher_id INTEGER REFERENCES teachers(id),
  credits INTEGER
);
CREATE TABLE students (
  id INTEGER PRIMARY KEY,
  name TEXT,
  grade_level INTEGER,
  city TEXT
);
CREATE TABLE enrollments (
  student_id INTEGER REFERENCES students(id),
  course_id INTEGER REFERENCES courses(id),
  score INTEGER
);
INSERT INTO teachers (id, name, department, hired_year) VALUES (1, 'Quinn Okafor', 'art', 2014);
INSERT INTO teachers (id, name, department, hired_year) VALUES (2, 'Vera Chen', 'art', 2009);
INSERT INTO teachers (id, name, department, hired_year) VALUES (3, 'Priya Haddad', 'languages', 2010);
INSERT INTO teachers (id, name, department, hired_year) VALUES (4, 'Chloe Larsen', 'physics', 2001);
INSERT INTO teachers (id, name, department, hired_year) VALUES (5, 'Ines Smith', 'physics', 2018);
INSERT INTO teachers (id, name, department, hired_year) VALUES (6, 'Jonas Okafor', 'languages', 2006);
INSERT INTO teachers (id, name, department, hired_year) VALUES (7, 'Wei Okafor', 'art', 2004);
INSERT INTO teachers (id, name, department, hired_year) VALUES (8, 'Quinn Ivanova', 'mathematics', 2005);
INSERT INTO teachers (id, name, department, hired_year) VALUES (9, 'Sven Muller', 'languages', 2018);
INSERT INTO teachers (id, name, department, hired_year) VALUES (10, 'Ines Silva', 'mathematics', 2007);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (1, 'Algebra', 8, 3);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (2, 'Geometry', 4, 2);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (3, 'Mechanics', 3, 2);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (4, 'Optics', 1, 4);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (5, 'Ancient Rome', 7, 6);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (6, 'Modern Europe', 3, 2);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (7, 'French', 5, 4);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (8, 'Spanish', 4, 4);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (9, 'Drawing', 2, 3);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (10, 'Sculpture', 9, 2);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (11, 'Statistics', 1, 6);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (12, 'Astronomy', 1, 6);
INSERT INTO students (id, name, grade_level, city) VALUES (1, 'Kira Rossi', 11, 'Osaka');
INSERT INTO students (id, name, grade_level, city) VALUES (2, 'David Smith', 12, 'Porto');
INSERT INTO students (id, name, grade_level, city) VALUES (3, 'Priya Rossi', 10, 'Dublin');
INSERT INTO students (id, name, grade_level, city) VALUES (4, 'Ines Chen', 11, 'Porto');
INSERT INTO students (id, name, grade_level, city) VALUES (5, 'Chloe Silva', 9, 'Porto');
INSERT INTO students (id, name, grade_level, city) VALUES (6, 'Rosa Smith', 9, 'Dublin');
INSERT INTO students (id, name, grade_level, city) VALUES (7, 'Yara Kowalski', 11, 'Austin');
INSERT INTO students (id, name, grade_level, city) VALUES (8, 'Farid Chen', 11, 'Oslo');
INSERT INTO students (id, name, grade_level, city) VALUES (9, 'Ines Smith', 10, 'Osaka');
INSERT INTO students (id, name, grade_level, city) VALUES (10, 'Tara Moreau', 12, 'Austin');
INSERT INTO students (id, name, grade_level, city) VALUES (11, 'Hiro Patel', 9, 'Lisbon');
INSERT INTO students (id, name, grade_level, city) VALUES (12, 'Farid Moreau', 12, 'Austin');
INSERT INTO students (id, name, grade_level, city) VALUES (13, 'Priya Larsen', 10, 'Austin');
INSERT INTO students (id, name, grade_level, city) VALUES (14, 'Kira Haddad', 11, 'Austin');
INSERT INTO students (id, name, grade_level, city) VALUES (15, 'Ana Novak', 10, 'Dublin');
INSERT INTO students (id, name, grade_level, city) VALUES (16, 'Elena Kowalski', 10, 'Lyon');
INSERT INTO students (id, name, grade_level, city) VALUES (17, 'Liam Haddad', 10, 'Lisbon');
INSERT INTO students (id, name, grade_level, city) VALUES (18, 'Hiro Ivanova', 10, 'Oslo');
INSERT INTO students (id, name, grade_level, city) VALUES (19, 'Farid Muller', 12, 'Porto');
INSERT INTO students (id, name, grade_level, city) VALUES (20, 'Omar Chen', 12, 'Porto');
INSERT INTO students (id, name, grade_level, city) VALUES (21, 'Liam Rossi', 11, 'Lisbon');
INSERT INTO students (id, name, grade_level, city) VALUES (22, 'Ana Chen', 10, 'Austin');
INSERT INTO students (id, name, grade_level, city) VALUES (23, 'Maya Patel', 10, 'Oslo');
INSERT INTO students (id, name, grade_level, city) VALUES (24, 'Umar Chen', 12, 'Lisbon');
INSERT INTO students (id, name, grade_level, city) VALUES (25, 'Sven Tanaka', 9, 'Dublin');
INSERT INTO students (id, name, grade_level, city) VALUES (26, 'David Moreau', 11, 'Osaka');
INSERT INTO students (id, name, grade_level, city) VALUES (27, 'Ana Okafor', 12, 'Krakow');
INSERT INTO students (id, name, grade_level, city) VALUES (28, 'Liam Ivanova', 10, 'Lyon');
INSERT INTO students (id, name, grade_level, city) VALUES (29, 'Zoe Moreau', 12, 'Osaka');
INSERT INTO students (id, name, grade_level, city) VALUES (30, 'Maya Chen', 12, 'Dublin');
INSERT INTO students (id, name, grade_level, city) VALUES (31, 'Zoe Novak', 12, 'Dublin');
INSERT INTO students (id, name, grade_level, city) VALUES (32, 'Ben Okafor', 11, 'Austin');
INSERT INTO students (id, name, grade_level, city) VALUES (33, 'Ben Rossi', 11, 'Krakow');
INSERT INTO students (id, name, grade_level, city) VALUES (34, 'Umar Larsen', 9, 'Porto');
INSERT INTO students (id, name, grade_level, city) VALUES (35, 'Quinn Moreau', 12, 'Osaka');
INSERT INTO enrollments (student_id, course_id, score) VALUES (1, 3, 54);
INSERT INTO enrollments (student_id, course_id, score) VALUES (1, 7, 81);
INSERT INTO enrollments (student_id, course_id, score) VALUES (1, 8, 67);
INSERT INTO enrollments (student_id, course_id, score) VALUES (1, 9, 87);
INSERT INTO enrollments (student_id, course_id, score) VALUES (1, 12, 82);
INSERT INTO enrollments (student_id, course_id, score) VALUES (2, 1, 57);
INSERT INTO enrollments (student_id, course_id, score) VALUES (2, 3, 96);
INSERT INTO enrollments (student_id, course_id, score) VALUES (2, 9, 78);
INSERT INTO enrollments (student_id, course_id, score) VALUES (2, 11, 88);
INSERT INTO enrollments (student_id, course_id, score) VALUES (3, 9, 63);
INSERT INTO enrollments (student_id, course_id, score) VALUES (3, 11, 98);
INSERT INTO enrollments (student_id, course_id, score) VALUES (4, 2, 77);
INSERT INTO enrollments (student_id, course_id, score) VALUES (4, 3, 88);
INSERT INTO enrollments (student_id, course_id, score) VALUES (4, 7, 87);
INSERT INTO enrollments (student_id, course_id, score) VALUES (4, 12, 63);
INSERT INTO enrollments (student_id, course_id, score) VALUES (5, 1, 63);
INSERT INTO enrollments (student_id, course_id, score) VALUES (5, 3, 51);
INSERT INTO enrollments (student_id, course_id, score) VALUES (5, 7, 93);
INSERT INTO enrollments (student_id, course_id, score) VALUES (5, 10, 98);
INSERT INTO enrollments (student_id, course_id, score) VALUES (6, 1, 91);
INSERT INTO enrollments (student_id, course_id, score) VALUES (6, 2, 67);
INSERT INTO enrollments (student_id, course_id, score) VALUES (6, 3, 64);
INSERT INTO enrollments (student_id, course_id, score) VALUES (6, 6, 83);
INSERT INTO enrollments (student_id, course_id, score) VALUES (6, 7, 88);
INSERT INTO enrollments (student_id, course_id, score) VALUES (6, 8, 90);
INSERT INTO enrollments (student_id, course_id, score) VALUES (6, 10, 81);
INSERT INTO enrollments (student_id, course_id, score) VALUES (6, 12, 77);
INSERT INTO enrollments (student_id, course_id, score) VALUES (7, 1, 75);
INSERT INTO enrollments (student_id, course_id, score) VALUES (8, 8, 52);
INSERT INTO enrollments (student_id, course_id, score) VALUES (8, 12, 74);
INSERT INTO enrollments (student_id, course_id, score) VALUES (9, 1, 71);
INSERT INTO enrollments (student_id, course_id, score) VALUES (9, 2, 85);
INSERT INTO enrollments (student_id, course_id, score) VALUES (9, 3, 82);
INSERT INTO enrollments (student_id, course_id, score) VALUES (9, 4, 85);
INSERT INTO enrollments (student_id, course_id, score) VALUES (9, 7, 47);
INSERT INTO enrollments (student_id, course_id, score) VALUES (10, 1, 77);
INSERT INTO enrollments (student_id, course_id, score) VALUES (10, 4, 63);
INSERT INTO enrollments (student_id, course_id, score) VALUES (10, 9, 51);
INSERT INTO enrollments (student_id, course_id, score) VALUES (10, 11, 91);
INSERT INTO enrollments (student_id, course_id, score) VALUES (11, 1, 55);
INSERT INTO enrollments (student_id, course_id, score) VALUES (11, 9, 53);
INSERT INTO enrollments (student_id, course_id, score) VALUES (12, 1, 48);
INSERT INTO enrollments (student_id, course_id, score) VALUES (12, 11, 40);
INSERT INTO enrollments (student_id, course_id, score) VALUES (13, 3, 47);
INSERT INTO enrollments (student_id, course_id, score) VALUES (13, 5, 54);
INSERT INTO enrollments (student_id, course_id, score) VALUES (13, 8, 78);
INSERT INTO enrollments (student_id, course_id, score) VALUES (14, 2, 67);
INSERT INTO enrollments (student_id, course_id, score) VALUES (14, 4, 43);
INSERT INTO enrollments (student_id, course_id, score) VALUES (14, 5, 58);
INSERT INTO enrollments (student_id, course_id, score) VALUES (14, 6, 73);
INSERT INTO enrollments (student_id, course_id, score) VALUES (14, 9, 73);
INSERT INTO enrollments (student_id, course_id, score) VALUES (14, 10, 59);
INSERT INTO enrollments (student_id, course_id, score) VALUES (15, 1, 57);
INSERT INTO enrollments (student_id, course_id, score) VALUES (15, 7, 96);
INSERT INTO enrollments (student_id, course_id, score) VALUES (15, 9, 67);
INSERT INTO enrollments (student_id, course_id, score) VALUES (16, 7, 65);
INSERT INTO enrollments (student_id, course_id, score) VALUES (16, 9, 98);
INSERT INTO enrollments (student_id, course_id, score) VALUES (17, 4, 87);
INSERT INTO enrollments (student_id, course_id, score) VALUES (17, 5, 93);
INSERT INTO enrollments (student_id, course_id, score) VALUES (17, 10, 78);
INSERT INTO enrollments (student_id, course_id, score) VALUES (17, 11, 88);
INSERT INTO enrollments (student_id, course_id, score) VALUES (18, 4, 56);
INSERT INTO enrollments (student_id, course_id, score) VALUES (18, 12, 68);
INSERT INTO enrollments (student_id, course_id, score) VALUES (19, 2, 85);
INSERT INTO enrollments (student_id, course_id, score) VALUES (19, 3, 75);
INSERT INTO enrollments (student_id, course_id, score) VALUES (19, 4, 46);
INSERT INTO enrollments (student_id, course_id, score) VALUES (19, 6, 91);
INSERT INTO enrollments (student_id, course_id, score) VALUES (19, 9, 63);
INSERT INTO enrollments (student_id, course_id, score) VALUES (19, 11, 53);
INSERT INTO enrollments (student_id, course_id, score) VALUES (21, 1, 52);
INSERT INTO enrollments (student_id, course_id, score) VALUES (21, 4, 62);
INSERT INTO enrollments (student_id, course_id, score) VALUES (21, 5, 94);
INSERT INTO enrollments (student_id, course_id, score) VALUES (22, 4, 48);
INSERT INTO enrollments (student_id, course_id, score) VALUES (22, 7, 47);
INSERT INTO enrollments (student_id, course_id, score) VALUES (22, 8, 69);
INSERT INTO enrollments (student_id, course_id, score) VALUES (23, 4, 60);
INSERT INTO enrollments (student_id, course_id, score) VALUES (23, 8, 59);
INSERT INTO enrollments (student_id, course_id, score) VALUES (23, 10, 55);
INSERT INTO enrollments (student_id, course_id, score) VALUES (24, 8, 83);
INSERT INTO enrollments (student_id, course_id, score) VALUES (25, 3, 52);
INSERT INTO enrollments (student_id, course_id, score) VALUES (25, 6, 63);
INSERT INTO enrollments (student_id, course_id, score) VALUES (25, 10, 82);
INSERT INTO enrollments (student_id, course_id, score) VALUES (25, 11, 81);
INSERT INTO enrollments (student_id, course_id, score) VALUES (27, 1, 81);
INSERT INTO enrollments (student_id, course_id, score) VALUES (27, 5, 76);
INSERT INTO enrollments (student_id, course_id, score) VALUES (28, 5, 77);
INSERT INTO enrollments (student_id, course_id, score) VALUES (28, 10, 77);
INSERT INTO enrollments (student_id, course_id, score) VALUES (28, 11, 64);
INSERT INTO enrollments (student_id, course_id, score) VALUES (29, 1, 67);
INSERT INTO enrollments (student_id, course_id, score) VALUES (29, 5, 51);
INSERT INTO enrollments (student_id, course_id, score) VALUES (29, 8, 66);
INSERT INTO enrollments (student_id, course_id, score) VALUES (29, 11, 81);
INSERT INTO enrollments (student_id, course_id, score) VALUES (30, 2, 48);
INSERT INTO enrollments (student_id, course_id, score) VALUES (30, 6, 51);
INSERT INTO enrollments (student_id, course_id, score) VALUES (30, 8, 81);
INSERT INTO enrollments (student_id, course_id, score) VALUES (30, 11, 50);
INSERT INTO enrollments (student_id, course_id, score) VALUES (31, 1, 60);
INSERT INTO enrollments (student_id, course_id, score) VALUES (31, 6, 41);
INSERT INTO enrollments (student_id, course_id, score) VALUES (31, 7, 58);
INSERT INTO enrollments (student_id, course_id, score) VALUES (31, 8, 67);
INSERT INTO enrollments (student_id, course_id, score) VALUES (32, 7, 97);
INSERT INTO enrollments (student_id, course_id, score) VALUES (32, 10, 66);
INSERT INTO enrollments (student_id, course_id, score) VALUES (32, 11, 91);
INSERT INTO enrollments (student_id, course_id, score) VALUES (33, 3, 46);
INSERT INTO enrollments (student_id, course_id, score) VALUES (33, 9, 98);
INSERT INTO enrollments (student_id, course_id, score) VALUES (33, 11, 79);
INSERT INTO enrollments (student_id, course_id, score) VALUES (33, 12, 95);
INSERT INTO enrollments (student_id, course_id, score) VALUES (34, 5, 65);
INSERT INTO enrollments (student_id, course_id, score) VALUES (35, 10, 91);
